"""One launch's lifecycle, after the gate passed: take the output folder's lock, record the run as running,
warm the compile cache, run torchrun (or a lone rank directly: `direct.py`, started beside the gate as its own
warm-up: `lone_rank.py`) under supervision, and close the record. In every path (a stop signal at any moment, a crash of our own) the record ends as interrupted,
succeeded or failed, never `running`. `dflash-doctor train` (the CLI) parses options, runs the gate and
prints; this is what it starts."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from dflash_base.errors import DoctorError
from dflash_base.stopping import Stopped, handling_stop_signals, signal_name
from dflash_doctor.launch import supervise
from dflash_doctor.launch.beside import Beside
from dflash_doctor.launch.bytecode_cache import with_bytecode_cache
from dflash_doctor.launch.compile_cache import (
    CachePreparation,
    WarmUpPlan,
    plan_warm_up,
    prepare_compile_cache,
    rank_warmed_up,
    snapshot_after_success,
)
from dflash_doctor.launch.direct import rank_environ
from dflash_doctor.launch.floor import check_floor
from dflash_doctor.launch.gate import GateResult, TrainingConfig
from dflash_doctor.launch.lone_rank import SEPARATE_ENV, LoneRank, starts_beside_the_gate
from dflash_doctor.launch.narrator import Narrator
from dflash_doctor.launch.output_lock import OutputLock
from dflash_doctor.launch.plan import LaunchPlan
from dflash_doctor.launch.run_outputs import last_metrics
from dflash_doctor.launch.runs import RunRecord, RunStore, new_run_id, this_launcher
from dflash_doctor.launch.supervise import TorchrunOutcome, describe_stop, run_torchrun, supervise_tree
from dflash_doctor.launch.timeline import TIMELINE_FILE, LaunchTimeline, timeline_rows
from dflash_doctor.launch.warden import Warden
from trainer.runspec.outputs import EXPORT_DIR


@dataclass
class RankStart:
    """A lone rank started beside the gate (`lone_rank.py`), and the warm-up plan it compiles under."""

    plan: WarmUpPlan
    rank: LoneRank | None  # None: the launch gave up before the rank was started


@dataclass
class EarlyWarmUp:
    """The compile cache made warm beside the gate: started once the checks it depends on pass
    (`gate.WARM_UP_NEEDS`, or fail under --force), beside the other static checks and the deep probe; stopped
    when the launch is refused (by any check) or unwinds. On an H200 the warm-up and the probe were 30 s and
    22.5 s one after the other, and on a freshly started one the static checks 10.5 s before it.

    For a lone rank what starts here is the rank itself (`lone_rank.py`): it compiles for itself and trains
    only on the go. It reads `output.dir`'s checkpoints while it starts, so the folder's lock is taken first,
    under the run id the run's record will have (a folder another run holds: no early rank, and the launch is
    refused at the lock after the gate, exit 2, as before); a refusal or our own unwinding releases it and
    removes what the rank's start made (its timeline in the run's folder; `output.dir` if the lock made it)."""

    json_out: bool = False  # the rank's stdout goes to stderr (`train --json`)
    timeline: LaunchTimeline = field(default_factory=LaunchTimeline)
    beside: Beside[CachePreparation | RankStart] | None = None
    run_id: str | None = None  # set when a lone rank starts here: its run's id from the start
    lock: OutputLock | None = None  # output.dir's, held from the rank's start until the run takes it
    recorded: bool = False  # the run's record exists: its folder is the run's now

    def start(self, early: GateResult, training: TrainingConfig, force: bool) -> None:
        if self.beside is not None or (early.failing and not force):
            return
        environ, _ = with_bytecode_cache(early.environ, early.findings)  # what the launch's processes get
        if starts_beside_the_gate(early.plan, environ) and self._take_output_folder(training):
            self.beside = Beside[CachePreparation | RankStart](
                lambda cancel: self._start_rank(early, training.path, environ, cancel), "lone-rank"
            ).start()
            return
        self.beside = Beside[CachePreparation | RankStart](
            lambda cancel: _prepare(early, training.path, environ, cancel), "warm-up"
        ).start()

    def _take_output_folder(self, training: TrainingConfig) -> bool:
        run_id, lock = new_run_id(), OutputLock(Path(training.config.output_dir).resolve())
        try:
            lock.acquire(run_id, os.getpid())
        except (DoctorError, OSError):  # held by another run, or it cannot be made or written
            lock.abandon()  # (a no-op unless it was half taken)
            return False  # said at the lock after the gate, as before
        self.run_id, self.lock = run_id, lock
        return True

    def _start_rank(
        self, gate: GateResult, config_path: Path, environ: dict[str, str], cancel: threading.Event
    ) -> RankStart:
        """The cache made ready for the rank (a snapshot restored when cold; the warm-up's key), then the rank
        started into it, its timeline in its run's folder: all in this thread, beside the gate."""
        plan = gate.plan
        warm = plan_warm_up(
            gate.context.env,
            environ,
            config_path,
            plan.device_type,
            _drafter_devices(plan),
            tuple(plan.overrides),
            local_workers=plan.nproc_per_node,
        )
        if cancel.is_set() or self.run_id is None:
            return RankStart(warm, None)
        folder = RunStore().path(self.run_id).parent
        folder.mkdir(parents=True, exist_ok=True)
        rank_env = rank_environ(self.timeline.worker_environ(environ, folder))
        rank = LoneRank.start(plan.command, rank_env, folder / "stop.log", self.json_out)
        self.timeline.mark("rank start")
        return RankStart(warm, rank)

    def rank_start(self) -> RankStart | None:
        """The lone rank started here, once its start is done (waits); None when the warm-up child runs."""
        if self.beside is None or self.run_id is None:
            return None
        started = self.beside.result()
        return started if isinstance(started, RankStart) else None

    def take_lock(self) -> OutputLock | None:
        """The run takes over output.dir's lock (and the run id) from here."""
        lock, self.lock = self.lock, None
        return lock

    def stop(self) -> None:
        """Stop what still runs (a refused launch, our own unwinding); nothing is left running or held."""
        if self.beside is not None:
            self.beside.stop()
            future = self.beside.future
            started = future.result() if future.done() and future.exception() is None else None
            if isinstance(started, RankStart) and started.rank is not None:
                started.rank.stop()
        if self.lock is not None:
            self.lock.abandon()
            self.lock = None
        if self.run_id is not None and not self.recorded:  # no record will hold the rank's files
            folder = RunStore().path(self.run_id).parent
            for name in (TIMELINE_FILE, "stop.log"):
                with contextlib.suppress(OSError):
                    (folder / name).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                folder.rmdir()


def _drafter_devices(plan: LaunchPlan) -> tuple[str, ...]:
    """The devices the warm-up compiles for: colocated ranks train a drafter too (it covers their target)."""
    return tuple(
        dict.fromkeys(
            r.device
            for r in plan.roles
            if r.role in ("drafter", "colocated") and r.node == 0 and r.device != "cpu"
        )
    )


def _prepare(
    gate: GateResult, config_path: Path, environ: dict[str, str], cancel: threading.Event | None = None
) -> CachePreparation:
    plan = gate.plan
    return prepare_compile_cache(
        gate.context.env,
        environ,
        config_path,
        plan.device_type,
        _drafter_devices(plan),
        tuple(plan.overrides),  # the user's --set and the topology the gate chose
        local_workers=plan.nproc_per_node,  # what sets the threads torchrun gives each worker
        **({} if cancel is None else {"cancel": cancel}),
    )


@dataclass
class LaunchRequest:
    """A launch the gate let through (or that `--force` pushes over failing findings)."""

    training: TrainingConfig
    gate: GateResult
    failing: list[str]  # failing finding ids launched over (--force)
    began: float  # perf_counter at the command's start: the launcher's share of time to first step
    gate_s: float
    node_rank: int
    nnodes: int
    json_out: bool  # torchrun's output goes to stderr, stdout carries the JSON document
    timeline: LaunchTimeline = field(default_factory=LaunchTimeline)  # the gate's marks, then ours
    verbose: bool = False  # `-v`: the timeline as a table at the end
    early: EarlyWarmUp | None = None  # the warm-up already started beside the deep probe


def launch_run(
    request: LaunchRequest, store: RunStore, common: dict[str, Any], environment: Any, console: Console
) -> RunRecord:
    """The run, from the output lock to its closed record (returned)."""
    early = request.early
    held = early.take_lock() if early is not None else None
    if held is not None and early is not None and early.run_id is not None:
        output_lock, run_id = held, early.run_id  # taken when the lone rank started beside the gate
    else:
        # One lock per node rank: the nodes of one run may share a folder, two launches of one node may not.
        output_lock = OutputLock(Path(request.training.config.output_dir).resolve(), request.node_rank)
        run_id = new_run_id()
        output_lock.acquire(run_id, os.getpid())  # a folder another run holds: refused here, exit 2
    try:
        # A multi-node run has one record per node (each launcher's own); say which node this one was.
        node = [f"node rank {request.node_rank} of {request.nnodes}"] if request.nnodes > 1 else []
        record = store.create(
            "running",
            environment=environment,
            forced_findings=request.failing,
            notes=node,
            **common,
            **this_launcher(),
            run_id=run_id,
        )
        if early is not None:
            early.recorded = True
        # closes the record if this launcher is killed outright (SIGKILL): each node of a run keeps its own
        warden = Warden.start(store.path(record.id))
        try:
            supervise_run(record, store, request, console, warden)
        finally:
            if warden is not None:
                warden.release()  # the record is closed (supervise_run saves it in every path)
    finally:
        output_lock.release()
    return record


def supervise_run(
    record: RunRecord, store: RunStore, request: LaunchRequest, console: Console, warden: Warden | None = None
) -> None:
    """Warm the cache, run torchrun, close the record, report: four steps, the record closed in every path
    (`warden`: told the process tree, for a launcher killed outright)."""
    say = Narrator(console)
    _note_launch_conditions(record, request, say)
    stop_log = store.path(record.id).parent / "stop.log"
    started = time.time()
    try:
        with handling_stop_signals():  # a stop during the warm-up unwinds as Stopped
            rank = _warm_compile_cache(record, store, request, say, stop_log)
            started = time.time()
            outcome = _run_torchrun(record, store, request, stop_log, say, rank, warden)
    except Stopped as stop:
        if request.early is not None:
            request.early.stop()  # a stop while waiting for the warm-up started beside the probe
        outcome = TorchrunOutcome(stop.exit_code, stop.signum)
    except BaseException as exc:
        if request.early is not None:
            request.early.stop()
        record.status, record.finished = "failed", time.time()
        record.notes.append(f"the launcher failed: {type(exc).__name__}: {exc}")
        record.timeline = request.timeline.to_json()
        store.save(record)
        raise
    try:
        _close_record(record, request, outcome, stop_log, started)
        _check_floor(record, request, say)
    except BaseException as exc:
        # The run ended as torchrun says (the status is set first); what failed is our bookkeeping after it.
        # The record says so and is saved; the error stays loud (a bug of ours is exit 3, with its traceback).
        if record.status == "running":
            record.status = "failed"
        record.notes.append(f"after the run, the launcher failed: {type(exc).__name__}: {exc}")
        raise
    finally:
        record.timeline = request.timeline.to_json()
        store.save(record)
    _report(record, outcome, stop_log, request.began, say)
    if request.verbose:
        _print_timeline(record.timeline, console)


def _note_launch_conditions(record: RunRecord, request: LaunchRequest, say: Narrator) -> None:
    """What the record must say about how this launch was made: --force, the probe reused, the bytecode cache."""
    gate = request.gate
    if request.failing:
        say(f"[yellow]! launching over failing findings (--force, recorded): {', '.join(request.failing)}[/]")
    if gate.probe_note:
        record.notes.append(gate.probe_note)
    gate.environ, bytecode_note = with_bytecode_cache(gate.environ, gate.findings)
    if bytecode_note:
        record.notes.append(bytecode_note)
        say(f"[dim]{escape(bytecode_note)}[/]")


@dataclass
class ReadyRank:
    """A lone rank that compiled beside the gate (or ended before it could), waiting for its go."""

    rank: LoneRank
    ended: bool  # it ended before its compile was done: supervision reads how, no go is given


def _warm_compile_cache(
    record: RunRecord, store: RunStore, request: LaunchRequest, say: Narrator, stop_log: Path
) -> ReadyRank | None:
    """Step 1: compile once, in one process, before any worker starts; record the time before torchrun.
    A lone rank started beside the gate compiles for itself: this waits for its report instead (returned)."""
    started = request.early.rank_start() if request.early is not None else None
    if started is not None:
        return _rank_compiled(started, record, store, request, say, stop_log)
    early = request.early.beside if request.early is not None else None
    waiting = (
        "compile cache: making it warm for this build before any worker starts "
        "(a cold compile runs once, in one process: a minute or two on CPU)"
    )
    say(f"[dim]{waiting}[/]")
    with say.status("warming the compile cache"):  # animates on a terminal only
        if early is not None:  # started beside the deep probe: wait for what is left of it
            prep = early.result()
            assert isinstance(prep, CachePreparation)  # a rank's start is handled above
            request.timeline.extra["warm_up_s"] = round(early.seconds or prep.seconds, 3)
        else:
            prep = _prepare(request.gate, request.training.path, request.gate.environ)
    record.notes.append(f"compile cache: {prep.action}: {prep.detail} ({prep.seconds:.1f} s)")
    say(f"compile cache: {escape(prep.detail)}")
    starts = "the rank" if request.gate.plan.launcher == "direct" else "torchrun"  # direct.py
    before = (
        f"before {starts}: {time.perf_counter() - request.began:.1f} s (gate {request.gate_s:.1f} s, "
        f"compile cache {prep.seconds:.1f} s)"
    )
    record.notes.append(before)
    say(f"[dim]{before}[/]")
    request.timeline.mark("warm-up")
    record.last_seen = time.time()
    store.save(record)
    return None


def _rank_compiled(
    started: RankStart,
    record: RunRecord,
    store: RunStore,
    request: LaunchRequest,
    say: Narrator,
    stop_log: Path,
) -> ReadyRank:
    """The lone rank's compile, waited for once the gate passed: its warm-up record kept as the child's would
    be, the notes saying where its time went. A compile that failed is the warm-up's failure (exit 2, as the
    child's), its output in the run's stop.log; a rank that ended otherwise before its go fails the run."""
    rank = started.rank
    assert rank is not None  # None only when the launch gave up before it started
    say("[dim]compile cache: the rank compiles its own graphs beside the gate (one process in all)[/]")
    with say.status("waiting for the rank's compile"):
        report = rank.wait_report()
    if report.failed is not None:
        with contextlib.suppress(OSError):
            stop_log.write_text("".join(f"{line}\n" for line in rank.held_stderr()))
        raise DoctorError(
            f"warm-up failed in the rank, which compiles for itself (exit {report.exit_code}): {report.failed}",
            hint=f"its output: {stop_log}; {SEPARATE_ENV}=1 runs the separate warm-up child instead",
        )
    if report.ready is None:
        prep = CachePreparation(
            started.plan.action, f"the rank ended (exit {report.exit_code}) before its compile was done", 0.0
        )
    else:
        prep = rank_warmed_up(started.plan, report.ready)
    record.notes.append(f"compile cache: {prep.action}: {prep.detail} ({prep.seconds:.1f} s)")
    say(f"compile cache: {escape(prep.detail)}")
    now = time.perf_counter() - request.began
    began_wall = time.time() - now  # the command's start on the wall clock (the timeline's marks)
    at = request.timeline.marks.get("rank start", began_wall)
    ready = report.ready.get("at") if report.ready is not None else None
    compiled = f", its compile done at {ready - began_wall:.1f} s" if isinstance(ready, float) else ""
    before = (
        f"before the rank: {at - began_wall:.1f} s (started beside the gate, once the checks its compile "
        f"depends on passed; gate {request.gate_s:.1f} s{compiled}, go at {now:.1f} s)"
    )
    record.notes.append(before)
    say(f"[dim]{before}[/]")
    record.last_seen = time.time()
    store.save(record)
    return ReadyRank(rank, ended=report.ready is None)


def _run_torchrun(
    record: RunRecord,
    store: RunStore,
    request: LaunchRequest,
    stop_log: Path,
    say: Narrator,
    ready: ReadyRank | None = None,
    warden: Warden | None = None,
) -> TorchrunOutcome:
    """Step 2: torchrun to its end or a stop signal, the record's "last seen" kept fresh meanwhile. A lone
    rank started beside the gate gets its go here and is supervised the same way."""

    def heartbeat() -> None:
        record.last_seen = time.time()
        store.save(record)

    direct = request.gate.plan.launcher == "direct"

    def stopping(signum: int, processes: int) -> None:
        whom = "the rank" if direct else "torchrun and its workers"
        say(
            f"[yellow]stopping the run ({signal_name(signum)}): signalled {whom} "
            f"({processes} process{'es' if processes != 1 else ''}); waiting up to {supervise.STOP_GRACE_S:.0f} s, "
            "then killing what is left[/]"
        )

    if ready is not None:
        launched = ready.rank.hand_over_ended() if ready.ended else ready.rank.go()
        if warden is not None:
            warden.watch(launched.proc.pid)
        try:
            return supervise_tree(launched, on_heartbeat=heartbeat, on_stopping=stopping)
        finally:
            ready.rank.close()
    # The first drafter appends its phases (torchrun start .. first step) to a file in the run's folder.
    environ = request.timeline.worker_environ(request.gate.environ, store.path(record.id).parent)
    if direct:  # what torchrun would have given its one worker (RANK=0, WORLD_SIZE=1, ...)
        environ = rank_environ(environ)
    return run_torchrun(
        request.gate.plan.command,
        environ,
        stop_log=stop_log,
        on_heartbeat=heartbeat,
        on_stopping=stopping,
        stdout_to_stderr=request.json_out,
        on_started=warden.watch if warden is not None else None,
    )


def _close_record(
    record: RunRecord, request: LaunchRequest, outcome: TorchrunOutcome, stop_log: Path, started: float
) -> None:
    """Step 3: the record's end: status, exit code, last metrics, why it failed; the cache snapshot on success.
    How the run ended is set first, from torchrun's outcome alone: whatever fails after it (reading the
    run's outputs, the snapshot) cannot leave the record `running` (supervise_run saves it in every path)."""
    record.exit_code = outcome.exit_code
    record.finished = record.last_seen = time.time()
    if outcome.interrupted:
        record.status = "interrupted"
        record.notes.append(describe_stop(outcome, stop_log))
    else:
        record.status = "succeeded" if outcome.exit_code == 0 else "failed"
        record.stderr_tail = list(outcome.stderr_tail)
        if outcome.killed:
            parent = "the rank" if request.gate.plan.launcher == "direct" else "torchrun"
            record.notes.append(f"{outcome.killed} process(es) {parent} left running were killed")
    record.metrics = last_metrics(Path(record.output_dir or "."), started)
    if record.status == "failed":
        record.reason = outcome.reason or _summary_error(record.metrics)
    if record.status == "succeeded":
        record.snapshot = snapshot_after_success(request.gate.context.env, request.gate.environ)
        record.notes.append(record.snapshot)


def _check_floor(record: RunRecord, request: LaunchRequest, say: Narrator) -> None:
    """Step 3b: with `[eval] prompts`, the export decoded after a run that succeeded (on node rank 0, which
    holds it); below `eval.min_tau` the run fails, recorded, the export kept (launch/floor.py)."""
    section = request.training.config.eval
    if record.status != "succeeded" or section.prompts is None or request.node_rank != 0:
        return
    plan = request.gate.plan
    export = Path(record.output_dir or request.training.config.output_dir) / EXPORT_DIR
    with say.status(f"decoding the export on {section.prompts} (eval.prompts)"):
        result = check_floor(plan.command[0], export, Path(plan.config_path), list(plan.overrides), section)
    record.floor = result.to_json()
    record.notes.append(result.line())
    say(f"  {escape(result.line())}")
    if not result.passed:
        record.status, record.exit_code, record.reason = "failed", 1, result.problem


def _report(record: RunRecord, outcome: TorchrunOutcome, stop_log: Path, began: float, say: Narrator) -> None:
    """Step 4: one line for how the run ended, and where to look next."""
    took = time.perf_counter() - began  # the whole launch: gate and warm-up included (issue 39 U4)
    style = "green" if record.status == "succeeded" else "red"
    say(
        f"[bold {style}]{record.status}[/] in {took:.0f} s · exit {record.exit_code} · run {record.id}"
        + (f" · {record.tokens_per_second:,.0f} tok/s" if record.tokens_per_second else "")
    )
    if (drift := record.drift_finding) is not None:  # the figure above then disagrees with the median step
        say(f"  [yellow]note:[/] {escape(drift)}")
    if outcome.interrupted:
        say(f"  {escape(record.notes[-1])}")
    elif outcome.reason is not None:  # a rank's named error, shown above; its echoes went to the log
        if stop_log.is_file():
            say(f"[dim]  the other processes' output after that error: {escape(str(stop_log))}[/]")
    elif record.status != "succeeded":
        say(f"  see what changed since the last good run: dflash-doctor runs show {record.id}")


def _print_timeline(data: dict[str, Any], console: Console) -> None:
    """`train -v`: where each second to the first step went (the same numbers as the record's `timeline`)."""
    from rich.table import Table

    table = Table(title="timeline (seconds from the command's start)", title_justify="left")
    for column in ("phase", "seconds", "ends at"):
        table.add_column(column)
    for row in timeline_rows(data):
        table.add_row(*(escape(cell) for cell in row))
    console.print(table)


def _summary_error(metrics: dict[str, Any]) -> str | None:
    """The error the trainer's summary.json names, when the run failed without a named error line."""
    error = metrics.get("error")
    return error if isinstance(error, str) and error else None
