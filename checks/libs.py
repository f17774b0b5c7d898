"""Shared libraries: does every soname torch needs resolve, and to the copy torch ships with?

All findings read one LibraryReport (dflash_doctor/libs/loader.py), a static simulation of glibc
loading torch: DT_RPATH before `LD_LIBRARY_PATH`, RUNPATH after it, torch's preloads by full path
first. So an old `libnccl.so.2` in an `LD_LIBRARY_PATH` folder that torch's RPATH outranks is not a
finding, while one that wins a RUNPATH lookup is.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator

from dflash_doctor.audit.packages import removable, wanted_pin
from dflash_doctor.context import CheckContext
from dflash_doctor.env.environment import Environment
from dflash_doctor.env.pip_commands import install_command, reinstall_command, uninstall_command
from dflash_doctor.findings import Finding, fail, ok, skip, warn
from dflash_doctor.libs.loader import LibraryReport, Resolution, library_report, start_reading_headers
from dflash_doctor.libs.sonames import cuda_major_of, is_cuda_soname, is_driver_soname, requirement_for
from dflash_doctor.registry import check

_LAZY_USE = {
    "libtorch_cuda_linalg.so": "torch.linalg on CUDA",
    "libcaffe2_nvrtc.so": "runtime-compiled CUDA kernels (NVRTC)",
}


def _describe(r: Resolution) -> str:
    owner = ", ".join(r.owners) or "no distribution"
    return f"{r.soname} -> {r.path} ({r.via}; {owner})"


def _tree_lib_folders(report: LibraryReport) -> list[str]:
    """torch/lib and every nvidia/*/lib of torch's site-packages: where the right copies live."""
    if report.torch_dir is None or report.site_dir is None:
        return []
    nvidia = os.path.join(report.site_dir, "nvidia")
    try:
        vendors = sorted(os.listdir(nvidia))
    except OSError:
        vendors = []
    return [os.path.join(report.torch_dir, "lib")] + [os.path.join(nvidia, d, "lib") for d in vendors]


def _tree_sonames(report: LibraryReport) -> set[str]:
    """File names torch's own tree ships: the sonames whose copy should come from there."""
    names: set[str] = set()
    for folder in _tree_lib_folders(report):
        try:
            names.update(os.listdir(folder))
        except OSError:
            continue
    return names


def _relevant(soname: str, tree: set[str]) -> bool:
    return is_cuda_soname(soname) or soname in tree


def _tree_copy(report: LibraryReport, soname: str) -> str | None:
    """The copy of `soname` inside torch's tree that a healthy install would load, if any."""
    for r in report.resolutions:
        if r.soname == soname and r.path and report.inside_torch_tree(r.path):
            return r.path
    for folder in _tree_lib_folders(report):
        candidate = os.path.join(folder, soname)
        if os.path.isfile(candidate):
            return candidate
    return None


def _reinstall_remedy(ctx: CheckContext, report: LibraryReport, soname: str) -> str | None:
    """Put the soname back: reinstall the distribution whose RECORD still lists it (the very command
    `ownership.missing_files` gives), else install what torch requires for it, pinned as torch pins it."""
    env = ctx.env
    for key, dist in env.distributions.items():  # a distribution still lists the vanished file
        if any(os.path.basename(row[0]) == soname for row in dist.record_rows):
            return reinstall_command(env, wanted_pin(ctx, key))
    torch_dist = env.torch_dist
    requires = torch_dist.requirements if torch_dist else []
    wanted = requirement_for(soname, report.cuda_major, requires)
    return install_command(env, shlex.quote(wanted)) if wanted else None


@check("libs.resolution", "shared libraries", starts=start_reading_headers)
def libs_resolution(ctx: CheckContext) -> Iterator[Finding]:
    env = ctx.env
    if env.torch is None:
        yield skip("libs.resolved", "torch is not installed: no libraries to resolve")
        return
    report = library_report(ctx)
    tree = _tree_sonames(report)
    yield from _missing(ctx, report)
    yield from _outside(ctx, report, tree)
    yield from _shadowed(env, report, tree)
    yield from _foreign_extensions(ctx, report)
    if not report.missing(("import", "lazy")):
        yield _resolved(report)


def _resolved(report: LibraryReport) -> Finding:
    loaded = [r for r in report.by_soname.values() if r.stage in ("import", "lazy")]
    ignored = _ignored_ld_library_path_copies(report)
    facts: dict[str, object] = {"libraries": len(loaded)}
    if report.cuda_major is None:
        summary = (
            f"CPU torch: no CUDA libraries needed; all {len(loaded)} libraries of `import torch` resolve"
        )
    else:
        cuda = report.cuda_sonames_of("libtorch_cuda.so")
        facts["libtorch_cuda.so"] = [_describe(r) for r in cuda]
        inside = sum(1 for r in cuda if r.path and report.inside_torch_tree(r.path))
        summary = (
            f"all {len(loaded)} libraries resolve; {inside} of {len(cuda)} CUDA sonames of "
            f"libtorch_cuda.so load from torch's own site-packages"
        )
    if report.ld_library_path:
        facts["ld_library_path"] = list(report.ld_library_path)
    if ignored:
        facts["ld_library_path_copies_outranked"] = ignored
    return ok("libs.resolved", summary, **facts)


def _ignored_ld_library_path_copies(report: LibraryReport) -> list[str]:
    """Copies in LD_LIBRARY_PATH folders that the process does not load (RPATH or a preload won)."""
    notes = []
    for soname, r in sorted(report.by_soname.items()):
        for folder in report.ld_library_path:
            candidate = os.path.join(folder, soname)
            if r.via != "ld_library_path" and os.path.isfile(candidate):
                notes.append(f"{candidate} unused: {soname} comes from {r.path} ({r.via})")
    return notes


def _missing(ctx: CheckContext, report: LibraryReport) -> Iterator[Finding]:
    by_soname: dict[str, list[Resolution]] = {}
    for r in report.missing(("import", "lazy")):
        by_soname.setdefault(r.soname, []).append(r)
    for soname, misses in by_soname.items():
        first = misses[0]
        requesters = sorted({m.requester for m in misses})
        if first.stage == "import":
            consequence = (
                f"`import torch` fails: {report.import_error}"
                if report.import_error and soname in report.import_error
                else "`import torch` fails"
            )
        else:
            users = [_LAZY_USE.get(os.path.basename(q), os.path.basename(q)) for q in requesters]
            consequence = f"first use of {', '.join(users)} fails"
        yield fail(
            "libs.missing",
            f"{soname} resolves nowhere: {consequence}",
            remedy=_reinstall_remedy(ctx, report, soname),
            soname=soname,
            needed_by=requesters,
            stage=first.stage,
            searched=list(first.searched),
        )


def _outside(ctx: CheckContext, report: LibraryReport, tree: set[str]) -> Iterator[Finding]:
    for r in report.resolutions:
        if r.stage == "extension" or r.path is None or r.via in ("loaded", "ld_library_path", "missing"):
            continue
        if not _relevant(r.soname, tree) or report.inside_torch_tree(r.path):
            continue
        winner = report.by_soname.get(r.soname)
        second_copy = winner is not None and winner is not r
        where = "an earlier sys.path entry" if r.via == "preload" else "the system"
        if second_copy:
            summary = f"a second copy of {r.soname} is loaded from {where}: {r.path}"
        else:
            summary = f"{r.soname} loads from {where} ({r.via}), not from torch's site-packages"
        tree_copy = _tree_copy(report, r.soname)
        kept: dict[str, list[str]] = {}
        if r.owners:
            # A copy hiding a second install of the same package further down sys.path may go: the
            # requirement stays met by the one it uncovers.
            hiding = [o for o in r.owners if o in {d.key for d in ctx.env.shadowed}]
            gone, kept = removable(ctx, [o for o in r.owners if o not in hiding])
            gone = hiding + gone
            remedy = f"{uninstall_command(ctx.env, *gone)}  # removes the copy at {r.path}" if gone else None
        else:
            remedy = _reinstall_remedy(ctx, report, r.soname)
        yield warn(
            "libs.outside",
            summary,
            remedy=remedy,
            soname=r.soname,
            path=r.path,
            via=r.via,
            owners=list(r.owners) or ["no distribution (system file)"],
            requested_by=r.requester,
            torch_copy=tree_copy or "none installed",
            **({"not_uninstalled_because_required_by": kept} if kept else {}),
        )


def _shadowed(env: Environment, report: LibraryReport, tree: set[str]) -> Iterator[Finding]:
    for r in report.resolutions:
        if r.via != "ld_library_path" or r.path is None or report.inside_torch_tree(r.path):
            continue
        if not _relevant(r.soname, tree):
            continue
        folder = os.path.dirname(r.path)
        kept = [p for p in report.ld_library_path if os.path.normpath(p) != folder]
        yield warn(
            "libs.shadowed",
            f"LD_LIBRARY_PATH decides {r.soname} for {os.path.basename(r.requester)}: {r.path} wins "
            "(the requester has RUNPATH or no RPATH, so LD_LIBRARY_PATH comes first)",
            remedy=f"export LD_LIBRARY_PATH={':'.join(kept)}" if kept else "unset LD_LIBRARY_PATH",
            soname=r.soname,
            requester=r.requester,
            loaded=r.path,
            would_load_otherwise=_tree_copy(report, r.soname) or "nothing in torch's tree",
            ld_library_path=list(report.ld_library_path),
        )


def _foreign_extensions(ctx: CheckContext, report: LibraryReport) -> Iterator[Finding]:
    seen: set[tuple[str, str]] = set()
    for r in report.resolutions:
        if r.stage != "extension" or (r.requester, r.soname) in seen or is_driver_soname(r.soname):
            continue
        major = cuda_major_of(r.soname)
        owners = ctx.env.owners_of(r.requester)
        owner = owners[0] if owners else None
        if major is not None and major != report.cuda_major:
            seen.add((r.requester, r.soname))
            torch_cuda = f"CUDA {report.cuda_major}" if report.cuda_major else "no CUDA (CPU torch)"
            facts = {
                "extension": r.requester,
                "distribution": owner or "unknown",
                "soname": r.soname,
                "resolved": r.path or "nowhere",
                "torch": torch_cuda,
                # No command: a reinstall brings back the same build; which index has the other is
                # the project's to say.
                "fix": f"install the build of {owner or 'its distribution'} made for {torch_cuda}",
            }
            remedy = None
            if r.path is None:
                yield fail(
                    "libs.foreign_extension",
                    f"{os.path.basename(r.requester)} needs {r.soname} (CUDA {major}) but torch has "
                    f"{torch_cuda}: importing it fails with ImportError: {r.soname}: cannot open shared object file",
                    remedy=remedy,
                    **facts,
                )
            else:
                yield warn(
                    "libs.foreign_extension",
                    f"{os.path.basename(r.requester)} is built for CUDA {major} beside a torch with "
                    f"{torch_cuda}: two CUDA runtimes in one process",
                    remedy=remedy,
                    **facts,
                )
        elif r.path is None:
            seen.add((r.requester, r.soname))
            yield fail(
                "libs.missing",
                f"{r.soname} resolves nowhere: importing {os.path.basename(r.requester)} fails",
                remedy=_reinstall_remedy(ctx, report, r.soname),
                soname=r.soname,
                needed_by=[r.requester],
                stage="extension",
                searched=list(r.searched),
            )
