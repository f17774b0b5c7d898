"""Independent slices of one job in forked processes, their results sent back through pipes (marshal).

A `check` of a GPU host's environment has jobs of ~50k small system calls or ~1,000 small files each: the stat
of every RECORD file, the compile cache's walk, and on a first run the METADATA, RECORDs and ELF headers. They
start in children before the checks that need them run (`start_slices`), so they overlap the other checks.
Threads do not help there (each call is short and they queue on the GIL between calls: an H200 host's stat
of 49,336 paths took 166 ms in one loop, 409 ms in 8 threads). Forked processes share no GIL and inherit the
job's inputs for free; each sends back one marshal-able result.

A process with other threads running, Python's or a native library's, is never forked (a lock another thread
holds would stay held in the child). A slice whose child fails for any reason, or whose fork fails, is done
again in this process, so the answer never depends on the fork; so is one that has not answered in
CHILD_DEADLINE_S (killed). A child restores the default action of the stop signals, so a handler the parent
installed (a lock's clean-up) never runs in it, and it never runs the parent's exit handlers.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# A child that has not answered by then is killed and its slice done here: a lock some thread held at the fork
# (one `thread_count` cannot see) would hang it forever. A slice takes milliseconds warm, a second or two cold.
CHILD_DEADLINE_S = 30.0

# A child dies of these as any process does; it never runs a handler the parent installed.
CHILD_DEFAULT_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, name)
)


def usable_cpus() -> int:
    """CPUs this process may run on (a container's or taskset's limit, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def thread_count() -> int:
    """Threads of this process: Python's and any a native library started (Linux's /proc/self/task), which
    `threading` does not see; else Python's own."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def can_fork() -> bool:
    """Forking is safe here: the platform has fork and no other thread of this process runs."""
    return hasattr(os, "fork") and thread_count() == 1


def process_count(items: int, per_process: int, limit: int) -> int:
    """Processes for `items` items: one per `per_process`, at most `limit` and the usable CPUs; one where
    forking is not safe."""
    wanted = min(limit, usable_cpus(), max(1, items // per_process))
    return wanted if wanted > 1 and can_fork() else 1


def start_slices(work: Callable[[int, int], T], count: int, processes: int, fork: bool = True) -> Started[T]:
    """`work(start, stop)` over `processes` slices of range(count), every slice in a forked child started now,
    so this process is free for other work until it asks for `results()`. With `fork` false, or where
    forking is not safe, nothing is forked and `results()` does the whole job then."""
    return Started(work, _bounds(count, processes), fork=fork and can_fork())


def start_job(work: Callable[[], T]) -> Started[T]:
    """`work()` in one forked child started now (where forking is safe); `results()[0]` is its answer."""
    return start_slices(lambda start, stop: work(), 1, 1)


class Started(Generic[T]):
    """Slices of a job running in forked children since it was made; `results()` waits for them once.

    A slice that could not be forked, or whose child failed, is done in this process when the results are
    asked for; `cancel()` (a result nobody will ask for) ends and reaps the children.
    """

    def __init__(self, work: Callable[[int, int], T], bounds: list[tuple[int, int]], fork: bool) -> None:
        self._work = work
        self._bounds = bounds
        self._children: dict[int, tuple[int, int]] = {}  # slice number -> pid, read end
        self._results: list[T] | None = None
        try:
            for number, (start, stop) in enumerate(bounds if fork else []):
                child = _fork(work, start, stop)
                if child is not None:  # else the slice is done here, when asked for
                    self._children[number] = child
        except BaseException:
            self.cancel()
            raise

    @property
    def children(self) -> int:
        """How many slices run in children (the others are done here)."""
        return len(self._children)

    def results(self) -> list[T]:
        """Every slice's result, in slice order."""
        if self._results is None:
            results: list[Any] = [None] * len(self._bounds)
            try:
                for number, bounds in enumerate(self._bounds):
                    done, value = False, None
                    if number in self._children:
                        done, value = _collect(*self._children.pop(number))
                    results[number] = value if done else self._work(*bounds)
            finally:
                self.cancel()  # after an interruption: no child left behind
            self._results = results
        return self._results

    def cancel(self) -> None:
        """End the children still running and reap them (their results are not wanted)."""
        while self._children:
            _, (pid, read_end) = self._children.popitem()
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            _close_and_wait(pid, read_end)


def _bounds(count: int, processes: int) -> list[tuple[int, int]]:
    if count <= 0:
        return []
    step = -(-count // max(1, processes))
    return [(start, min(start + step, count)) for start in range(0, count, step)]


def _fork(work: Callable[[int, int], Any], start: int, stop: int) -> tuple[int, int] | None:
    """Start a child that runs one slice and writes its result (marshal) to a pipe: (pid, read end)."""
    try:
        read_end, write_end = os.pipe()
    except OSError:
        return None
    try:
        pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return None
    if pid == 0:  # the child: never returns, never runs the parent's exit handlers or flushes its buffers
        code = 1
        try:
            for number in CHILD_DEFAULT_SIGNALS:
                signal.signal(number, signal.SIG_DFL)
            os.close(read_end)
            view = memoryview(marshal.dumps(work(start, stop)))
            while view:
                view = view[os.write(write_end, view) :]
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    return pid, read_end


def _collect(pid: int, read_end: int) -> tuple[bool, Any]:
    """(True, the child's result), or (False, None) when it failed or did not finish within CHILD_DEADLINE_S
    (it is killed; the caller then does its slice)."""
    chunks: list[bytes] = []
    ends = time.monotonic() + CHILD_DEADLINE_S
    ready = select.poll()  # not select.select: that refuses a descriptor numbered 1024 or more
    ready.register(read_end, select.POLLIN)
    try:
        while True:
            if not ready.poll(max(0.0, ends - time.monotonic()) * 1000):
                os.kill(pid, signal.SIGKILL)  # hung: never wait for it again
                chunks = []
                break
            chunk = os.read(read_end, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError:
        chunks = []
    status = _close_and_wait(pid, read_end)
    if status != 0 or not chunks:
        return False, None
    try:
        return True, marshal.loads(b"".join(chunks))
    except (EOFError, ValueError, TypeError):
        return False, None


def _close_and_wait(pid: int, read_end: int) -> int | None:
    """Close our end of the pipe (a child still writing then ends on EPIPE) and reap the child: its exit code."""
    with contextlib.suppress(OSError):
        os.close(read_end)
    try:
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    except ChildProcessError:
        return None
