"""`train` owns the processes it starts: torchrun and every worker, stopped together, none left behind.
A lone rank started without torchrun (`direct.py`) is supervised the same way: it is the tree's root.

torchrun starts each worker in a session of its own, so a signal to torchrun's process group never reaches
them, and once torchrun is gone they are re-parented to PID 1 and keep training (issue 18, row 1). Here
torchrun runs in its own session too (a terminal's Ctrl-C reaches only the launcher), its process tree is
remembered while it runs, and a stop signal is forwarded to every member; after a bounded wait whatever is
left is killed. A second stop signal kills at once.

While stopping, the processes' stderr (three tracebacks of KeyboardInterrupt/SignalException, ~150 lines)
goes to a log file instead of the terminal, so a stop reads as one line; stdout (the progress) is untouched.
The same once a rank prints an error a person can act on (`trainer.runspec.outputs.error_line`: a full disk, a
bad data line): that line is shown and kept as the run's reason, and what follows it (the peers losing that
rank, torchrun's failure summary: ~150 lines) goes to the log.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from dflash_base.stopping import handling_stop_signals, signal_name
from dflash_doctor.processes import ProcessTree, dying_with_us
from trainer.runspec.outputs import reason_of

STOP_GRACE_S = 30.0  # how long torchrun and the workers get to exit after the signal, before SIGKILL
TICK_S = 0.5  # how often the tree is re-read (a worker must be known before torchrun can vanish)
HEARTBEAT_S = 30.0  # how often `on_heartbeat` runs while torchrun runs (the record's "last seen")


@dataclass(frozen=True)
class TorchrunOutcome:
    exit_code: int  # torchrun's, or 128+signal when a stop signal ended the run
    stop_signal: int | None = None
    killed: int = 0  # processes still alive after the grace period (or left by torchrun), killed
    stderr_tail: tuple[str, ...] = ()  # the last lines the processes wrote to stderr (why a run failed)
    reason: str | None = None  # the error a rank named (`rank 1: no space left ...`), when one did

    @property
    def interrupted(self) -> bool:
        return self.stop_signal is not None


TAIL_LINES = 40
HELD_LINES = 2000  # a held rank's stderr kept until the gate's verdict (a compile's traceback fits)


class StderrRelay(threading.Thread):
    """Copies the children's stderr to ours line by line; after `quiet()`, into `log` instead. Keeps the
    last lines shown, so a failed run's record can say why; the first error line a rank prints (its reason)
    is shown, kept in `reason`, and quiets the rest.

    `hold=True` (a lone rank started beside the gate, `lone_rank.py`): lines are kept, not shown, until
    `release()` shows them (the gate passed) or `discard()` drops them (it refused: nothing of a rank it stopped
    reaches the terminal). The pipe is drained either way, so the rank never blocks on a full one."""

    def __init__(self, source: IO[bytes], sink: IO[bytes], log: Path | None, hold: bool = False) -> None:
        super().__init__(name="stderr-relay", daemon=True)
        self.source, self.sink, self.log_path = source, sink, log
        self._quiet = threading.Event()
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.reason: str | None = None
        self._lock = threading.Lock()
        self._held: list[bytes] | None = [] if hold else None
        self._log: IO[bytes] | None = None

    def quiet(self) -> None:
        self._quiet.set()

    def release(self) -> None:
        """Show what was held, then relay live."""
        with self._lock:
            held, self._held = self._held or [], None
            for line in held:
                self._relay(line)

    def discard(self) -> None:
        """Drop what was held and what follows (a refused launch's rank)."""
        with self._lock:
            self._held = []
            self._quiet.set()
            self.log_path = None

    @property
    def held(self) -> list[str]:
        with self._lock:
            return [line.decode("utf-8", errors="replace").rstrip() for line in self._held or []]

    def run(self) -> None:
        try:
            for line in iter(self.source.readline, b""):
                with self._lock:
                    if self._held is not None:
                        self._held.append(line)
                        del self._held[:-HELD_LINES]
                    else:
                        self._relay(line)
        finally:
            if self._log is not None:
                self._log.close()
            self.source.close()

    def _relay(self, line: bytes) -> None:
        if not self._quiet.is_set():
            text = line.decode("utf-8", errors="replace").rstrip()
            self.tail.append(text)
            with contextlib.suppress(OSError, ValueError):
                self.sink.write(line)
                self.sink.flush()
            reason = reason_of(text)
            if reason is not None:
                self.reason = reason
                self.quiet()  # the rest is its echo: peers losing that rank, torchrun's summary
            return
        if self.log_path is not None and self._log is None:
            with contextlib.suppress(OSError):
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                self._log = open(self.log_path, "ab")  # noqa: SIM115  (closed when the stream ends)
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.write(line)


@dataclass
class Launched:
    """A process tree `train` started and owns: the process, its remembered descendants, its stderr relay."""

    proc: subprocess.Popen[bytes]
    tree: ProcessTree
    relay: StderrRelay


def launch_tree(
    command: list[str],
    environ: dict[str, str],
    stop_log: Path | None = None,
    stdout_to_stderr: bool = False,
    hold: bool = False,
    pass_fds: tuple[int, ...] = (),
    dies_with_launcher: bool = False,
) -> Launched:
    """Start `command` in a session of its own, its stderr through a relay (`hold`: kept until released).
    `stdout_to_stderr`: keep our stdout for one JSON document (`train --json`). `dies_with_launcher`: the
    kernel sends it SIGTERM when this thread's process dies, SIGKILL included (`processes.dying_with_us`);
    only from a thread that supervises it to its end (a lone rank started beside the gate watches its go link
    instead)."""
    proc = subprocess.Popen(
        dying_with_us(command, signal.SIGTERM, environ) if dies_with_launcher else command,
        env=environ,
        start_new_session=True,
        stderr=subprocess.PIPE,
        stdout=sys.stderr.fileno() if stdout_to_stderr else None,
        pass_fds=pass_fds,
    )
    assert proc.stderr is not None
    relay = StderrRelay(proc.stderr, sys.stderr.buffer, stop_log, hold=hold)
    relay.start()
    return Launched(proc, ProcessTree(proc.pid), relay)


def run_torchrun(
    command: list[str],
    environ: dict[str, str],
    stop_log: Path | None = None,
    on_heartbeat: Callable[[], None] | None = None,
    on_stopping: Callable[[int, int], None] | None = None,
    grace_s: float | None = None,
    stdout_to_stderr: bool = False,
    on_started: Callable[[int], None] | None = None,
) -> TorchrunOutcome:
    """Run torchrun (or a lone rank: `command` is whatever the plan starts) to the end, or stop it and every
    worker on SIGINT/SIGTERM/SIGHUP. A process ended by a signal not ours exits 128+N, its reason named.
    `on_started(pid)`: told the tree's root once it runs (the launcher's warden, `warden.py`).

    `on_stopping(signum, processes)` runs once when a stop begins (to say so in one line), from the main
    loop, never inside the signal handler. Always returns with no process of the tree left alive.
    `stdout_to_stderr`: keep our stdout for one JSON document (`train --json`).
    """
    # torchrun (and a lone rank started here) dies with the launcher, SIGKILL included: torchrun stops its
    # workers on the SIGTERM, and they no longer train on, holding the GPUs, for a run recorded `lost` (N6)
    main = threading.current_thread() is threading.main_thread()
    launched = launch_tree(command, environ, stop_log, stdout_to_stderr, dies_with_launcher=main)
    if on_started is not None:
        on_started(launched.proc.pid)
    return supervise_tree(launched, on_heartbeat, on_stopping, grace_s)


def supervise_tree(
    launched: Launched,
    on_heartbeat: Callable[[], None] | None = None,
    on_stopping: Callable[[int, int], None] | None = None,
    grace_s: float | None = None,
) -> TorchrunOutcome:
    """`run_torchrun`'s supervision of a tree already started (a lone rank started beside the gate)."""
    grace = STOP_GRACE_S if grace_s is None else grace_s
    stops: list[int] = []
    proc, tree, relay = launched.proc, launched.tree, launched.relay

    def on_signal(signum: int, _frame: object) -> None:
        stops.append(signum)
        relay.quiet()
        tree.refresh()
        tree.send(signal.SIGKILL if len(stops) > 1 else signum)  # a second Ctrl-C: kill now

    with handling_stop_signals(on_signal):
        last_beat = time.monotonic()
        while proc.poll() is None and not stops:
            tree.refresh()
            if on_heartbeat is not None and time.monotonic() - last_beat >= HEARTBEAT_S:
                last_beat = time.monotonic()
                on_heartbeat()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=TICK_S)
        if stops:
            if on_stopping is not None:
                on_stopping(stops[0], len(tree.alive()))
            tree.wait_gone(time.monotonic() + grace)
        killed = tree.kill_all()  # after a stop: what outlived the grace; else: what torchrun left behind
        code = proc.wait()
    relay.join(timeout=5)
    if stops:
        return TorchrunOutcome(128 + stops[0], stops[0], killed)
    reason = relay.reason if code else None
    if code < 0:  # ended by a signal not ours (the OOM killer): as a shell says it, and named
        reason = reason or f"the launched process was killed by {signal_name(-code)}"
        code = 128 - code
    return TorchrunOutcome(code, None, killed, tuple(relay.tail) if code else (), reason)


def describe_stop(outcome: TorchrunOutcome, log: Path | None) -> str:
    """One line for the end of an interrupted run."""
    assert outcome.stop_signal is not None
    parts = [f"stopped by {signal_name(outcome.stop_signal)}"]
    if outcome.killed:
        parts.append(f"{outcome.killed} process(es) still running after the grace period were killed")
    if log is not None and log.is_file():
        parts.append(f"their output while stopping: {log}")
    return "; ".join(parts)
