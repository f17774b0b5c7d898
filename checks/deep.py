"""deep.*: what a real `import torch` in the audited interpreter did (`check --deep`).

The probe child (dflash_doctor/deep/probe_child.py) reports; these checks judge, reading the report
against the static model: an import failure is explained by file owners, every loaded library is
named with its owning distribution, and where the process and the static loader model disagree on
which file a soname came from, that is a finding (the static model is what every other check trusts).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from dflash_doctor.context import CheckContext
from dflash_doctor.findings import Finding, Severity, fail, ok, skip, warn
from dflash_doctor.registry import check

# The probe and its comparisons are imported by the checks that run (`--deep`), not by every `check`.
if TYPE_CHECKING:
    from dflash_doctor.deep.run import ProbeReport

FLEX_TOLERANCE = (
    1e-2  # relative error; fp32/TF32 rounding stays near 1e-3, a wrong kernel (pytorch#158212) near 1
)
FLEX_MEMORY_FRACTION = 0.5  # the dense path holds at least one full score matrix; the fused kernel far less


def _report_or_skip(ctx: CheckContext, check_id: str, need_import: bool = True) -> ProbeReport | Finding:
    from dflash_doctor.deep.run import deep_report

    report = deep_report(ctx)
    if not report.ran:
        return skip(check_id, f"no deep report: {report.error}")
    if need_import and not report.import_ok:
        return skip(check_id, "import torch failed in the probe (see deep.import)")
    return report


@check("deep.probe", "deep probe", requires=["deep"])
def deep_probe(ctx: CheckContext) -> Iterator[Finding]:
    from dflash_doctor.deep.run import deep_report

    report = deep_report(ctx)
    if not report.ran:
        yield fail(
            "deep.probe",
            f"the deep probe of {ctx.env.interpreter.executable} gave no report: {report.error}",
            remedy=f"{ctx.env.interpreter.executable} -c 'import torch; print(torch.cuda.is_available())'",
            stderr=report.stderr_tail,
        )
        return
    yield ok(
        "deep.probe",
        f"probe ran in {report.seconds} s (python {report.raw.get('python_version')})",
        python=report.raw.get("python"),
        inductor_cache=report.raw.get("inductor_cache"),
    )


def _static_predictions(ctx: CheckContext) -> dict[str, str] | None:
    """soname -> file the static loader model says the process maps; None without the model."""
    try:
        from dflash_doctor.libs.loader import library_report
    except ImportError:
        return None
    report = library_report(ctx)
    return {soname: res.path for soname, res in report.by_soname.items() if res.path}


@check("deep.import", "import torch", requires=["deep"])
def deep_import(ctx: CheckContext) -> Iterator[Finding]:
    report = _report_or_skip(ctx, "deep.import", need_import=False)
    if isinstance(report, Finding):
        yield report
        return
    if report.import_ok:
        torch = report.torch
        yield ok(
            "deep.import",
            f"import torch {torch.get('version')} took {report.import_error.get('seconds')} s",
            torch=torch.get("file"),
        )
        return
    from dflash_doctor.deep.compare import explain_import_error

    error = report.import_error
    message = f"{error.get('error_type')}: {error.get('message')}"
    predicted = _static_predictions(ctx)
    versions = {key: dist.version for key, dist in ctx.env.distributions.items()}
    why = explain_import_error(
        str(error.get("message", "")), ctx.env.owners, ctx.env.interpreter.executable, predicted, versions
    )
    yield fail("deep.import", why.summary, remedy=why.remedy, error=message, **why.evidence)


def _owner_label(ctx: CheckContext, path: str) -> str:
    owners = ctx.env.owners_of(path)
    return ", ".join(owners) if owners else "(no distribution: system or driver)"


def _is_interesting(path: str) -> bool:
    """The libraries worth listing: torch's, the NVIDIA ones, anything CUDA-named."""
    from dflash_doctor.deep.compare import CUDA_FAMILIES

    name = os.path.basename(path)
    return "/torch/" in path or "/nvidia/" in path or any(name.startswith(f + ".so") for f in CUDA_FAMILIES)


@check("deep.libraries", "loaded libraries", requires=["deep"])
def deep_libraries(ctx: CheckContext) -> Iterator[Finding]:
    report = _report_or_skip(ctx, "deep.libraries", need_import=False)
    if isinstance(report, Finding):
        yield report
        return
    yield from library_findings(ctx, report, _static_predictions(ctx))


def library_findings(
    ctx: CheckContext, report: ProbeReport, predicted: dict[str, str] | None
) -> Iterator[Finding]:
    from dflash_doctor.deep.compare import CUDA_FAMILIES, duplicate_families, static_disagreements

    loaded = report.loaded
    known = {os.path.realpath(p) for p in (predicted or {}).values()}
    listed = [
        f"{p}  [{_owner_label(ctx, p)}]" for p in loaded if _is_interesting(p) or os.path.realpath(p) in known
    ]
    yield ok(
        "deep.libraries",
        f"{len(listed)} libraries of torch and CUDA mapped ({len(loaded)} shared objects in all)",
        loaded=listed,
    )
    for family, paths in duplicate_families(loaded).items():
        severe = family in CUDA_FAMILIES
        yield (fail if severe else warn)(
            "deep.libraries.duplicate",
            f"{family} is mapped from {len(paths)} files in one process: symbols resolve to whichever came first",
            remedy="unset LD_LIBRARY_PATH  # and remove the stray copy: dflash-doctor why " + family,
            files=[f"{p}  [{_owner_label(ctx, p)}]" for p in paths],
        )
    if predicted is None:
        yield skip("deep.libraries.static", "static library model unavailable: loaded files not compared")
        return
    if not report.import_ok:
        return  # a half-loaded process says nothing about where a full import would load from
    disagreements = static_disagreements(predicted, loaded)
    for d in disagreements:
        yield fail(
            "deep.libraries.static",
            f"{d.soname}: the process loaded {d.loaded}, the static model predicted {d.predicted}",
            remedy="dflash-doctor check --only libs --verbose  # then report this: the static model is wrong",
            soname=d.soname,
            loaded=f"{d.loaded}  [{_owner_label(ctx, d.loaded or '')}]",
            predicted=f"{d.predicted}  [{_owner_label(ctx, d.predicted)}]",
            ld_library_path=report.raw.get("ld_library_path", ""),
        )
    if not disagreements:
        mapped = {os.path.realpath(p) for p in loaded}
        agreed = sorted(s for s, p in predicted.items() if os.path.realpath(p) in mapped)
        yield ok(
            "deep.libraries.static",
            f"the static model and the process agree on all {len(agreed)} libraries both know",
            agreed=agreed,
        )


@check("deep.versions", "loaded library versions", requires=["deep"])
def deep_versions(ctx: CheckContext) -> Iterator[Finding]:
    report = _report_or_skip(ctx, "deep.versions")
    if isinstance(report, Finding):
        yield report
        return
    yield from versions_findings(report, _owner_cuda_builds(ctx, report))


def _owner_cuda_builds(ctx: CheckContext, report: ProbeReport) -> dict[str, tuple[int, str]]:
    """Loaded library path -> (CUDA major, how we know) from the distribution that installed the
    file (`nvidia-nccl-cu13` -> 13): the fallback where the library itself does not say."""
    from dflash_doctor.audit.packages import cuda_families

    families = cuda_families(ctx)
    found: dict[str, tuple[int, str]] = {}
    for entry in report.versions.values():
        path = entry.get("path")
        owners = [o for o in (ctx.env.owners_of(path) if path else []) if o in families]
        if path and len({families[o].major for o in owners}) == 1:  # twins of two families: the bytes decide
            found[path] = (families[owners[0]].major, f"installed by {', '.join(owners)}")
    return found


def versions_findings(
    report: ProbeReport, owner_builds: dict[str, tuple[int, str]] | None = None
) -> Iterator[Finding]:
    from dflash_doctor.deep.compare import version_verdicts

    versions = dict(report.versions)
    for family, entry in versions.items():
        known = (owner_builds or {}).get(entry.get("path") or "")
        if not entry.get("cuda_build") and known is not None:
            versions[family] = {**entry, "cuda_build": [known[0]], "cuda_build_from": known[1]}
    verdicts = version_verdicts(report.torch, versions)
    asked = {k: v.get("parsed", v.get("message")) for k, v in versions.items()}
    if not verdicts:
        yield skip("deep.versions", "no CUDA library loaded to ask (CPU build?)", asked=asked)
        return
    for v in verdicts:
        if v.severity is Severity.OK:
            continue
        if v.what == "cuda_build":
            yield fail(
                "deep.versions.cross_family",
                f"the loaded {v.library} is {v.note}",
                loaded_from=v.path,
                torch_cuda=report.torch.get("cuda"),
                see="ownership.twins and packages.cuda_family name the package whose files these are",
            )
            continue
        make = fail if v.severity is Severity.FAIL else warn
        yield make(
            f"deep.versions.{v.library}",
            f"loaded {v.library} {'.'.join(map(str, v.loaded or []))} vs compiled "
            f"{'.'.join(map(str, v.compiled or []))}: {v.note}",
            remedy="unset LD_LIBRARY_PATH  # keep the pip copy torch was built with; then dflash-doctor check --deep",
            loaded_from=v.path,
        )
    if all(v.severity is Severity.OK for v in verdicts):
        own = ", ".join(
            f"{v.library} {'.'.join(map(str, v.loaded or []))}" for v in verdicts if v.what == "version"
        )
        builds = ", ".join(
            f"{v.library} CUDA {'.'.join(map(str, v.loaded or []))}"
            for v in verdicts
            if v.what == "cuda_build"
        )
        summary = f"loaded libraries match torch's build: {own}"
        if builds:
            summary += f"; built for torch's CUDA {report.torch.get('cuda')}: {builds}"
        yield ok("deep.versions", summary, asked=asked)


@check("deep.cuda", "CUDA runtime", requires=["deep"])
def deep_cuda(ctx: CheckContext) -> Iterator[Finding]:
    report = _report_or_skip(ctx, "deep.cuda")
    if isinstance(report, Finding):
        yield report
        return
    yield from cuda_findings(report)


def cuda_findings(report: ProbeReport) -> Iterator[Finding]:
    cuda = report.cuda
    if not cuda.get("available"):
        yield skip("deep.cuda", f"CUDA not available: {cuda.get('reason', 'unknown')}")
        return
    broken = {
        f"cuda:{dev}.{lib}": result.get("message")
        for dev, steps in (cuda.get("touch") or {}).items()
        for lib, result in steps.items()
        if isinstance(result, dict)
    }
    nccl = cuda.get("nccl") or {}
    if nccl.get("status") == "error":
        broken["nccl"] = nccl.get("message")
    devices = [
        f"{d['index']}: {d['name']} (sm_{d['capability'][0]}{d['capability'][1]})"
        for d in cuda.get("devices", [])
    ]
    if broken:
        yield fail(
            "deep.cuda",
            "CUDA libraries failed at first use: " + "; ".join(f"{k}: {v}" for k, v in broken.items()),
            remedy="dflash-doctor check --only libs,deep --verbose",
            devices=devices,
        )
        return
    yield ok(
        "deep.cuda",
        f"{len(devices)} GPU(s) initialised; cuBLAS, cuDNN and NCCL ({nccl.get('status', 'not run')}) work",
        devices=devices,
        arch_list=cuda.get("arch_list"),
    )


@check("deep.context", "CUDA context overhead", requires=["deep"])
def deep_context(ctx: CheckContext) -> Iterator[Finding]:
    report = _report_or_skip(ctx, "deep.context")
    if isinstance(report, Finding):
        yield report
        return
    locked = _locked_overhead(ctx)
    yield from context_findings(report, locked)


def _locked_overhead(ctx: CheckContext) -> dict[str, float]:
    if ctx.options.lock_path is None:
        return {}
    from dflash_base.errors import DoctorError
    from dflash_doctor.lock.lockfile import read_lock

    try:
        lock = read_lock(ctx.options.lock_path)
    except DoctorError:
        return {}
    return {k: float(v) for k, v in (lock.runtime.get("context_overhead_mib") or {}).items()}


def context_findings(report: ProbeReport, locked: dict[str, float]) -> Iterator[Finding]:
    from dflash_doctor.lock.drift import CONTEXT_GROWTH_MIB

    cuda = report.cuda
    if not cuda.get("available"):
        yield skip("deep.context", f"CUDA not available: {cuda.get('reason', 'unknown')}")
        return
    overhead: dict[str, Any] = cuda.get("context_overhead_mib") or {}
    if not overhead:
        yield skip("deep.context", f"context overhead not measured: {cuda.get('overhead_method')}")
        return
    for dev, mib in sorted(overhead.items()):
        before = locked.get(dev)
        if before is not None and float(mib) - before > CONTEXT_GROWTH_MIB:
            yield warn(
                "deep.context.grew",
                f"cuda:{dev}: the CUDA context now takes {mib} MiB per process, {float(mib) - before:.0f} MiB more "
                f"than when locked ({before} MiB): budget it per GPU or find what changed (dflash-doctor diff)",
                remedy="dflash-doctor diff",
                locked_mib=before,
                now_mib=mib,
            )
    yield ok(
        "deep.context",
        "CUDA context + cuBLAS/cuDNN overhead per process: "
        + ", ".join(f"cuda:{d} {m} MiB" for d, m in sorted(overhead.items())),
        method=cuda.get("overhead_method"),
        locked=locked or "no lock value",
    )


@check("deep.flex", "compiled flex_attention", requires=["deep"])
def deep_flex(ctx: CheckContext) -> Iterator[Finding]:
    report = _report_or_skip(ctx, "deep.flex")
    if isinstance(report, Finding):
        yield report
        return
    yield from flex_findings(report.flex)


def flex_findings(flex: dict[str, Any]) -> Iterator[Finding]:
    """Fail when the dense path ran, nothing was compiled, memory was dense-sized, or results differ."""
    status = flex.get("status")
    if status == "skipped" or status is None:
        yield skip("deep.flex", f"flex proof not run: {flex.get('reason', 'no report')}")
        return
    if status == "error":
        yield fail(
            "deep.flex",
            f"compiling flex_attention failed: {flex.get('error_type')}: {flex.get('message')}",
            remedy="dflash-doctor check --only hazards,cache  # then run the probe again",
            traceback=flex.get("traceback"),
        )
        return
    counters = flex.get("counters") or {}
    problems = []
    if flex.get("dense_warnings"):
        problems.append("flex_attention warned it ran uncompiled (dense path)")
    if not counters.get("frames_ok") or not counters.get("unique_graphs"):
        problems.append("Dynamo compiled nothing (frames_ok/unique_graphs are 0)")
    if counters.get("graph_breaks"):
        problems.append(f"{counters['graph_breaks']} graph break(s)")
    fwd = flex.get("forward_rel_err", flex.get("forward_max_abs_diff"))
    if fwd is None or not fwd <= FLEX_TOLERANCE:  # NaN fails too
        problems.append(f"forward differs from the dense reference (relative error {fwd})")
    bwd = flex.get("backward_rel_err", flex.get("backward_max_abs_diff"))
    if bwd is not None and not bwd <= FLEX_TOLERANCE:
        problems.append(f"gradients differ from the dense reference (relative error {bwd}; pytorch#158212?)")
    peak, dense = flex.get("peak_extra_mib"), flex.get("dense_score_matrix_mib")
    if peak is not None and dense and peak > FLEX_MEMORY_FRACTION * dense:
        problems.append(f"peak memory {peak} MiB is near the dense score matrix ({dense} MiB)")
    evidence = {
        "device": flex.get("device"),
        "shape": flex.get("shape"),
        "counters": counters,
        "forward_rel_err": fwd,
        "backward_rel_err": bwd if bwd is not None else "not run (no backward on CPU)",
        "peak_extra_mib": peak if peak is not None else "not measured on CPU",
        "dense_score_matrix_mib": dense,
        "compile_seconds": flex.get("compile_seconds"),
    }
    if problems:
        yield fail(
            "deep.flex",
            "flex_attention proof failed: " + "; ".join(problems),
            remedy="dflash-doctor check --only hazards  # something disables or silences compilation",
            dense_warnings=flex.get("dense_warnings"),
            **evidence,
        )
        return
    where = "forward and backward" if bwd is not None else "forward"
    yield ok(
        "deep.flex",
        f"compiled flex_attention ran on {flex.get('device')} and matches the dense reference ({where})",
        **evidence,
    )
