"""Child processes we start, and everything they start: tracked, stopped together, none left behind.

`subprocess.run(..., capture_output=True, timeout=...)` is not enough for a child that starts workers
(Inductor's compile workers, torch's process pools): on timeout it kills the child only, then waits for EOF
on pipes that a grandchild still holds, so it can block long past its timeout and leave the grandchildren
running. `run_child` starts the child in a session of its own, collects its output in unlinked files (no pipe
for a grandchild to keep open), and when the child ends, times out, or we are interrupted, stops its whole
process group and every descendant seen while it ran (`ProcessTree`: one that started a session of its own
is out of the group, so it is remembered by pid).

The launch's supervisor (`launch/supervise.py`) uses `ProcessTree` for torchrun and its workers; the deep
probe (`deep/run.py`) and the warm-up child (`cache/warm.py`) use `run_child`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO

import psutil

from dflash_base.errors import DoctorError

TICK_S = 0.2  # how often the tree is re-read while the child runs
STOP_GRACE_S = 2.0  # after SIGTERM, how long the group gets before SIGKILL
OUTPUT_LIMIT = 8 << 20  # the most of each stream kept (its end): a runaway child cannot fill our memory


class ProcessTree:
    """A process and every descendant seen while it ran (remembered: an orphan cannot be found later)."""

    def __init__(self, pid: int) -> None:
        self.root_pid = pid
        self.known: dict[int, psutil.Process] = {}
        with contextlib.suppress(psutil.Error):
            self.known[pid] = psutil.Process(pid)

    def refresh(self) -> None:
        root = self.known.get(self.root_pid)
        if root is None:
            return
        with contextlib.suppress(psutil.Error):
            for child in root.children(recursive=True):
                self.known.setdefault(child.pid, child)

    def alive(self) -> list[psutil.Process]:
        return [p for p in self.known.values() if _alive(p)]

    def send(self, signum: int) -> int:
        """Signal every living member; returns how many were signalled."""
        sent = 0
        for process in self.alive():
            with contextlib.suppress(psutil.Error):
                process.send_signal(signum)
                sent += 1
        return sent

    def wait_gone(self, deadline: float) -> None:
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.1)

    def kill_all(self) -> int:
        left = self.alive()
        for process in left:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(left, timeout=5)
        return len(left)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@dataclass(frozen=True)
class ChildResult:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


class ChildCancelled(Exception):
    """The caller gave up on a child running beside it (`cancel` set); it and its descendants were stopped."""


class ChildTimedOut(DoctorError):
    """A child did not finish in time; it and everything it started were stopped. Carries what it wrote."""

    def __init__(self, message: str, hint: str | None, stdout: str, stderr: str) -> None:
        super().__init__(message, hint)
        self.stdout, self.stderr = stdout, stderr


# Run by path-less `python -c` between our fork and the child's own exec: asks the kernel to send the child
# `argv[1]` when its parent dies (PR_SET_PDEATHSIG, kept across exec), checks the parent did not die before it
# asked (then the child's parent is another process), and becomes the child's command. A shim rather than a
# `preexec_fn`, which Python calls unsafe in a process with threads (ours has several).
_DEATH_SHIM = (
    "import ctypes, os, sys\n"
    "if ctypes.CDLL(None).prctl(1, int(sys.argv[1]), 0, 0, 0) != 0 or os.getppid() != int(sys.argv[2]):\n"
    "    os._exit(70)\n"
    "os.execv(sys.argv[3], sys.argv[3:])\n"
)


def dying_with_us(
    command: Sequence[str], signum: int = signal.SIGKILL, env: Mapping[str, str] | None = None
) -> list[str]:
    """`command`, started so that the kernel sends it `signum` when this process dies, SIGKILL included (a
    launcher or `cache warm` killed outright left its child compiling into a cache nobody held, and torchrun's
    workers holding the GPUs; issue 58, W2 and N6). The signal follows the death of the *thread* that started
    it: only for a child whose starting thread waits for it to end (`run_child`, the launcher's main thread).
    The program is found here, on `env`'s PATH as Popen finds it: one that cannot run is an OSError for the
    caller, as it was without the shim, not a traceback of the shim's."""
    program = command[0]
    if "/" not in program:
        found = shutil.which(program, path=(os.environ if env is None else env).get("PATH", os.defpath))
        if found is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        program = found
    elif not os.path.isfile(program):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    elif not os.access(program, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
    shim = [sys.executable, "-S", "-I", "-c", _DEATH_SHIM, str(int(signum)), str(os.getpid())]
    return [*shim, program, *command[1:]]


def run_child(
    args: Sequence[str],
    timeout: float,
    what: str,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    hint: str | None = None,
    cancel: threading.Event | None = None,
    pass_fds: Sequence[int] = (),
) -> ChildResult:
    """Run `args` to the end, within `timeout` seconds, and return its exit code and output.

    Whatever happens (normal end, timeout, KeyboardInterrupt or `Stopped` while waiting) the child's process
    group and every descendant seen are stopped and the child is reaped before this returns or raises.
    Timeout: `ChildTimedOut` ("<what> did not finish within N s"). OSError when it cannot start. `cancel`
    (a child run from a thread beside other work): once set, the child is stopped and `ChildCancelled` raised.
    The child dies with us, whatever kills us (`dying_with_us`); `pass_fds`: descriptors it inherits (the locks
    it must hold while it lives).
    """
    start = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            dying_with_us(args, env=env),
            pass_fds=tuple(pass_fds),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=None if env is None else dict(env),
            cwd=cwd,
            start_new_session=True,  # its own process group: stopped as one, and a terminal's Ctrl-C is ours
        )
        tree = ProcessTree(proc.pid)
        try:
            code = _wait(proc, tree, start + timeout, cancel)
        finally:
            stop_group(proc, tree)  # also on our own interruption: nothing outlives the call
        stdout, stderr = _read_tail(out), _read_tail(err)
    seconds = time.monotonic() - start
    if code is None:
        raise ChildTimedOut(
            f"{what} did not finish within {timeout:.0f} s; it was stopped with every process it started",
            hint,
            stdout,
            stderr,
        )
    return ChildResult(code, stdout, stderr, seconds)


def _wait(
    proc: subprocess.Popen[bytes], tree: ProcessTree, deadline: float, cancel: threading.Event | None = None
) -> int | None:
    """The child's exit code, or None at the deadline; its descendants are remembered meanwhile."""
    while True:
        tree.refresh()
        if cancel is not None and cancel.is_set():
            raise ChildCancelled("cancelled by the caller")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(timeout=min(TICK_S, remaining))


def stop_group(proc: subprocess.Popen[bytes], tree: ProcessTree, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the child's process group and every remembered descendant, SIGKILL what outlives `grace_s`,
    reap the child."""
    tree.refresh()
    try:
        _signal_group(proc.pid, signal.SIGTERM)
        tree.send(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
        tree.wait_gone(deadline)
    finally:  # also when a second Ctrl-C cuts the grace short
        _signal_group(proc.pid, signal.SIGKILL)  # members the tree never saw (started between two reads)
        tree.kill_all()
        proc.wait()


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _read_tail(handle: IO[bytes]) -> str:
    """The stream's text, its last OUTPUT_LIMIT bytes when longer."""
    size = handle.seek(0, os.SEEK_END)
    handle.seek(max(0, size - OUTPUT_LIMIT))
    return handle.read().decode("utf-8", errors="replace")
