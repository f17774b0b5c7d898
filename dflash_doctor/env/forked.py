"""Independent slices of one job in forked processes, their results sent back through pipes (marshal).

A `check` of a GPU host's environment has three jobs of ~50k small system calls or ~800 small files each:
the stat of every RECORD file, and on a first run the RECORDs' parsing and the ELF headers of every extension.
Threads do not help there (each call is short and they queue on the GIL between calls: an H200 host's stat
of 49,336 paths took 166 ms in one loop, 409 ms in 8 threads). Forked processes share no GIL and inherit the
job's inputs for free; each sends back one marshal-able result.

A process with other threads running is never forked (a lock another thread holds would stay held in the
child). A slice whose child fails for any reason, or whose fork fails, is done again in this process, so the
answer never depends on the fork. A child restores the default action of the stop signals, so a handler the
parent installed (a lock's clean-up) never runs in it, and it never runs the parent's exit handlers.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import signal
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

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


def can_fork() -> bool:
    """Forking is safe here: the platform has fork and no other thread of this process runs."""
    return hasattr(os, "fork") and threading.active_count() == 1


def process_count(items: int, per_process: int, limit: int) -> int:
    """Processes for `items` items: one per `per_process`, at most `limit` and the usable CPUs; one where
    forking is not safe."""
    wanted = min(limit, usable_cpus(), max(1, items // per_process))
    return wanted if wanted > 1 and can_fork() else 1


def map_slices(work: Callable[[int, int], T], count: int, processes: int) -> list[T]:
    """`work(start, stop)` over `processes` contiguous slices of range(count), in slice order: the first
    slice in this process, the others in forked children (each result must be marshal-able)."""
    if count <= 0:
        return []
    step = -(-count // max(1, processes))
    bounds = [(start, min(start + step, count)) for start in range(0, count, step)]
    results: list[Any] = [None] * len(bounds)
    children: list[tuple[int, int, int]] = []  # pid, read end, slice number
    try:
        for number, (start, stop) in enumerate(bounds[1:], start=1):
            child = _fork(work, start, stop)
            if child is None:  # could not fork: this slice is ours too
                results[number] = work(start, stop)
            else:
                children.append((*child, number))
        results[0] = work(*bounds[0])
        while children:
            pid, read_end, number = children[0]
            done, value = _collect(pid, read_end)
            children.pop(0)
            results[number] = value if done else work(*bounds[number])
    finally:
        for pid, read_end, _ in children:  # after an interruption: no child left behind
            _close_and_wait(pid, read_end)
    return results


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
    """(True, the child's result), or (False, None) when it failed (the caller then does its slice)."""
    chunks: list[bytes] = []
    try:
        while chunk := os.read(read_end, 1 << 20):
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
