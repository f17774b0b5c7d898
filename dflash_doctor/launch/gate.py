"""The launch gate: validate the config, plan the launch, run every check that matters for it.

A launch that cannot work never starts: any failing finding stops it (unless `--force`, which is
recorded). The checks are the normal registry (static environment, libraries, GPUs, compile cache,
hazards) plus the `launch.*` checks that need the config, and the deep probe. A probe that passed in this
exact environment before is read back instead of run again (`probe_record`); `deep=True` probes anew.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_base.errors import DoctorError
from dflash_doctor.cache.locations import managed_inductor_dir, snapshots_dir
from dflash_doctor.context import CheckContext, CheckOptions
from dflash_doctor.deep.run import CACHE_ENV, ProbeReport, deep_report, probe_of
from dflash_doctor.env.environment import Environment
from dflash_doctor.env.gpus import GpuInventory, gpu_inventory
from dflash_doctor.findings import Finding, Severity
from dflash_doctor.launch.beside import Beside
from dflash_doctor.launch.disk_plan import disk_facts
from dflash_doctor.launch.link import LINK, LinkReport, drafter_devices, link_request, run_link_check
from dflash_doctor.launch.memory_plan import HOST_AVAILABLE, host_available_bytes
from dflash_doctor.launch.node_plans import node_plan
from dflash_doctor.launch.plan import LaunchPlan, NodeFacts, TorchrunOptions, build_launch_plan
from dflash_doctor.launch.probe_record import ProbeRecord, ProbeRecords, probe_key
from dflash_doctor.launch.timeline import LaunchTimeline
from dflash_doctor.lock.lockfile import current_lock
from dflash_doctor.registry import CheckRun, run_checks
from dflash_doctor.report import flatten

if TYPE_CHECKING:  # types only: load_training_config imports the trainer's config code lazily, saying why
    from trainer.runspec.config import TrainConfig
    from trainer.runspec.target_shapes import TargetShapes


@dataclass
class TrainingConfig:
    """A validated, target-completed trainer config and where it came from."""

    path: Path
    config: TrainConfig
    target_config: (
        TargetShapes  # the target's shapes, read without transformers where config.json says enough
    )
    text: str
    overrides: list[str] = field(default_factory=list)  # `--set section.key=value`, passed to the workers
    notes: list[str] = field(default_factory=list)  # what the overrides replaced in the file (U14b)


def load_training_config(path_or_name: str, overrides: list[str] | None = None) -> TrainingConfig:
    """Validate with the trainer's own loader: a bad field is a ConfigError (exit 2) naming it.

    The trainer's config code must import in the interpreter running dflash-doctor; when it cannot, we say
    so plainly instead of a traceback. Only the target's shapes are read (trainer.runspec.target_shapes): neither
    the model code (torch's compiler stack) nor, where config.json says enough, transformers: 13-14 s of
    imports per process on the H200 machine, before torchrun.
    """
    try:
        from trainer.runspec.config import load_config
        from trainer.runspec.config_file import read_raw, replaced_by_overrides, resolve_config_path
        from trainer.runspec.target_shapes import target_shapes
    except (ImportError, OSError) as exc:
        raise DoctorError(
            f"the trainer cannot be imported by {sys.executable}: {exc}",
            hint=f"`dflash-doctor check --python {sys.executable}` says why and how to fix it",
        ) from exc

    path = resolve_config_path(path_or_name).resolve()
    cfg = load_config(path, overrides or [])
    notes = replaced_by_overrides(read_raw(path), list(overrides or []))
    return TrainingConfig(
        path, cfg, target_shapes(cfg.target.path), path.read_text(), list(overrides or []), notes
    )


def launch_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """The workers' compile cache lives in the managed, non-volatile folder, one tree for Inductor and
    Triton (TRITON_CACHE_DIR unset: Inductor keeps Triton kernels in `<cache>/triton`), so one snapshot
    and one atomic restore cover everything they compile."""
    environ = dict(os.environ if base is None else base)
    environ["TORCHINDUCTOR_CACHE_DIR"] = str(managed_inductor_dir())
    environ.pop("TRITON_CACHE_DIR", None)
    environ.setdefault("PYTHONUNBUFFERED", "1")
    return environ


# The checks that read the deep probe's report: run after every other check, so the probe's child runs
# beside those (a cold probe: 22.5 s on an H200, 4-5 s on a 2-core CPU box; the static checks 1-3 s).
PROBE_JUDGES = ("deep", "gpu.arch")
# The checks the launch's warm-up depends on: the compile cache it writes (cache.*), what silences or
# disables compiling (hazards), the bytecode folder its child is given (startup.bytecode). They run first and
# the warm-up starts once they pass, beside the other static checks (on a freshly started H200 those took
# 10.5 s of reading a cold disk before the warm-up could start: issue 40 §2); any check that fails later still
# refuses the launch, and the refusal stops the warm-up.
WARM_UP_NEEDS = ("cache", "hazards", "startup")
# Run last, after the static checks: the checks that judge the probe, and the one that judges the link check
# between nodes (its child waits for the other nodes beside the checks).
DEFERRED = (*PROBE_JUDGES, "launch.nodes")


@dataclass
class GateResult:
    context: CheckContext
    runs: list[CheckRun]
    plan: LaunchPlan
    environ: dict[str, str] = field(default_factory=dict)
    probe_note: str | None = None  # what became of the deep probe: reused, run and kept, run and not kept

    @property
    def findings(self) -> list[Finding]:
        return flatten(self.runs)

    @property
    def failing(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.FAIL]


def probe_inductor_cache() -> str:
    """Where the gate's deep probe compiles its flex proof: a folder of its own that persists.

    `check --deep` compiles the proof in a fresh folder each time (it proves the compiler works now). Before
    a launch the warm-up child compiles the real graphs anyway, so the gate keeps the proof's kernels: on
    the H200 the probe took 19.5 s, 11.5 of them compiling; on this CPU box 19 s cold, 7 s from this folder.
    DFLASH_DOCTOR_DEEP_INDUCTOR_CACHE still wins when set.
    """
    return os.environ.get(CACHE_ENV) or str(snapshots_dir().parent / "probe-inductor")


def node_facts(ctx: CheckContext, output_dir: Path) -> NodeFacts:
    """What the plan reads of this node, read in one place: the GPUs the launch sees and the least free
    memory among them, the run's checkpoints already in `output_dir`, the managed compile cache's size; and the
    host's available memory for `launch.memory`, before the gate starts a process of its own beside it."""
    ctx.shared(HOST_AVAILABLE, host_available_bytes)
    gpus = gpu_inventory(ctx)
    devices = gpus.devices if isinstance(gpus, GpuInventory) else []
    return NodeFacts(
        gpu_count=len(devices),
        gpu_free_bytes=min((d.free_bytes for d in devices), default=None),
        disk=disk_facts(Path(output_dir).resolve(), managed_inductor_dir()),
    )


def run_gate(
    training: TrainingConfig,
    python: str | None,
    torchrun: TorchrunOptions | None = None,
    deep: bool | None = None,
    lock_path: Path | None = None,
    timeline: LaunchTimeline | None = None,
    on_warm_up_ready: Callable[[GateResult], None] | None = None,
    join_timeout_s: float | None = None,
) -> GateResult:
    """`deep`: None reuses a passed probe of this exact environment (else probes), True always probes,
    False runs no probe. `timeline` gets the gate's marks: the static checks' end, then the probe's.
    `on_warm_up_ready(first)`: called once the checks the warm-up depends on (`WARM_UP_NEEDS`) are done,
    before the other static checks, with a GateResult of their findings only. `join_timeout_s`: a multi-node
    launch meets the other nodes at its endpoint and measures the link (`link.py`), waiting this long for them;
    None measures nothing (`--dry-run`). A join that did not happen raises its DoctorError (exit 2)."""
    timeline = timeline or LaunchTimeline()
    env = Environment.load(python)
    timeline.note("environment")
    environ = launch_environment()
    options = CheckOptions(
        deep=deep is not False, lock_path=lock_path, config_path=training.path, config=training.config
    )
    ctx = CheckContext(env, options)
    node = node_facts(ctx, training.config.output_dir)
    timeline.note("GPUs and disk")
    plan = build_launch_plan(
        training.config,
        training.path,
        training.target_config,
        env.interpreter.executable,
        node,  # topology.mode = "auto" keeps only what fits the least free GPU memory
        torchrun,
        environ={k: environ[k] for k in ("TORCHINDUCTOR_CACHE_DIR",)},
        overrides=training.overrides,
    )
    options.extra["launch_plan"] = plan
    if plan.device_type == "cuda":
        from dflash_doctor.launch.split import recommendation_for_config

        # From the per-role rates measured on an H200 (dflash_doctor/data/role_rates.json).
        sync = plan.choice.sync if plan.choice is not None else None
        recommendation = recommendation_for_config(
            training.config, node.gpu_count, sync=sync, nodes=plan.nnodes
        )
        if recommendation is not None:
            options.extra["split_recommendation"] = recommendation
    # The compile-cache checks judge the folder the workers will use, not this shell's default.
    options.extra["cache_environ"] = environ
    # The flex proof matters where training uses flex (CUDA); on CPU training uses SDPA.
    options.extra["deep_flex"] = plan.device_type == "cuda"
    options.extra["deep_inductor_cache"] = probe_inductor_cache()
    timeline.note("launch plan")
    key = probe_key(current_lock(ctx), {"flex": options.extra["deep_flex"]}) if options.deep else None
    timeline.note("probe key")
    reused = ProbeRecords().find(key) if key is not None and deep is None else None
    probe: Beside[ProbeReport] | None = None
    if reused is not None:
        ctx.shared("deep.report", lambda: reused.report)  # the deep checks judge the kept report
    elif key is not None:  # the probe's child runs beside the static checks; its judges wait for it
        probe = Beside(probe_of(ctx), "deep-probe").start()
        ctx.pending("deep.report", probe.result)

    link = _start_link_check(ctx, training, plan, torchrun, join_timeout_s)

    def static_done(static: list[CheckRun]) -> None:
        timeline.mark("gate")  # the static checks' end; the probe may still run

    def warm_up_ready(first: list[CheckRun]) -> None:
        timeline.note("warm-up checks")  # the warm-up may start from here
        if on_warm_up_ready is not None:  # the launch's warm-up, beside the rest of the gate
            on_warm_up_ready(GateResult(ctx, first, plan, environ))

    try:
        runs = run_checks(
            ctx, defer=DEFERRED, between=static_done, first=WARM_UP_NEEDS, after_first=warm_up_ready
        )
    finally:
        for beside in (probe, link):
            if beside is not None:
                beside.stop()  # done by now, unless we are unwinding: then its child is stopped, not left
    timeline.mark("deep probe")  # the wait for the probe (and the other nodes) after the static checks
    if probe is not None and probe.seconds is not None:
        timeline.extra["probe_s"] = round(probe.seconds, 3)
    if link is not None:
        report = link.result()
        timeline.extra["link_s"] = round(report.seconds, 3)
        if (
            report.error is not None
        ):  # an endpoint nobody answered, a rank given twice, a node that never came
            raise report.error
    env.save_parse_cache()
    note = None
    if reused is not None:
        runs = findings_from(runs, reused)
        note = f"deep probe: the passed probe from {reused.date} (same environment, driver, GPUs, probe) was reused; --deep probes anew"
    elif key is not None:
        note = keep_if_passed(ctx, runs, key)
    return GateResult(ctx, runs, plan, environ, note)


def _deep_failures(runs: list[CheckRun]) -> list[str]:
    return [f.id for f in flatten(runs) if f.area == "deep" and f.severity is Severity.FAIL]


def keep_if_passed(ctx: CheckContext, runs: list[CheckRun], key: str) -> str:
    """Keep the probe this gate ran when every deep finding passed; say what happened."""
    report = deep_report(ctx)
    failed = _deep_failures(runs)
    if not report.ran or failed:
        return (
            f"deep probe: ran; not kept ({', '.join(failed) or report.error}): the next launch probes again"
        )
    ProbeRecords().save(key, report)
    return f"deep probe: ran in {report.seconds} s; kept for launches from this same environment"


def findings_from(runs: list[CheckRun], record: ProbeRecord) -> list[CheckRun]:
    """The deep findings of a reused probe say when it ran ("from <date>")."""

    def dated(finding: Finding) -> Finding:
        if finding.area != "deep":
            return finding
        evidence = {**finding.evidence, "probed": record.date}
        return replace(finding, summary=f"{finding.summary} (from {record.date})", evidence=evidence)

    return [replace(run, findings=[dated(f) for f in run.findings]) for run in runs]


def _start_link_check(
    ctx: CheckContext,
    training: TrainingConfig,
    plan: LaunchPlan,
    torchrun: TorchrunOptions | None,
    join_timeout_s: float | None,
) -> Beside[LinkReport] | None:
    """A multi-node launch: this node's link check, started beside the checks (`launch.nodes` judges it)."""
    if plan.nnodes < 2 or torchrun is None:
        return None
    if join_timeout_s is None:
        ctx.options.extra["link_skipped"] = "--dry-run measures nothing between nodes; a launch does"
        return None
    request = link_request(
        torchrun.rdzv_endpoint,
        (torchrun.master_addr, torchrun.master_port),
        torchrun.rdzv_backend,
        torchrun.node_rank or 0,
        plan.nnodes,
        plan.device_type,
        node_plan(training.config, plan),
        join_timeout_s,
        torchrun.rdzv_id,
        drafter_devices(plan.roles, torchrun.node_rank or 0, plan.nnodes),
    )
    if isinstance(request, str):
        ctx.options.extra["link_skipped"] = request
        return None
    interpreter = ctx.env.interpreter.executable
    link = Beside(lambda cancel: run_link_check(interpreter, request, cancel), "link-check").start()
    ctx.pending(LINK, link.result)
    return link
