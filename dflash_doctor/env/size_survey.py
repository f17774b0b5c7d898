"""Stat every file the RECORDs list and report only what differs, in a few forked processes.

A warm `check` on a GPU host's environment (~50k files in RECORDs) spends most of its own time here: ~3 µs a
`stat`, and as much again in the Python loop around it. Threads do not help: each `stat` is a short system
call and the threads queue on the GIL between them (an H200 host, 49,336 paths, median of 9: one thread
166 ms, 2 threads 243 ms, 4 414 ms, 8 409 ms; `bench/check/stat_survey.py`). Forked processes share no GIL.
Each takes a contiguous slice (a package's files share folders, so the kernel's lookups stay warm), compares
the sizes itself and sends back only the exceptions, so the parent's work grows with what is wrong, not with
the size of the environment.

A process with other threads running is never forked (a lock another thread holds would stay held in the
child); a child that fails for any reason has its slice done again in the parent, so the answer never
depends on the fork.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import signal
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

# Below this many paths a slice is not worth a process: a fork, exit and wait of a process holding a 50k-file
# environment cost ~2 ms on a 2-core box (~25 ms of stat work at ~3 µs a path).
PATHS_PER_PROCESS = 8192
# At most this many processes: 4 slices of ~12k paths on an H200 host's 16 cores (the 2-process figure is 0.58x one
# process on a 2-core box; 4 on the H200 not measured yet: bench/check/stat_survey.py in bench/suites/check_h200.sh).
MAX_PROCESSES = 4

StatFacts = tuple[int, int, int]  # size, mtime_ns, ctime_ns
# A child dies of these as any process does; it never runs a handler the parent installed.
CHILD_DEFAULT_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, name)
)


@dataclass
class Survey:
    """What the `stat` of every path found, by index into the paths given."""

    missing: list[int] = field(default_factory=list)  # the stat failed: the file is gone (or unreadable)
    resized: list[tuple[int, int]] = field(default_factory=list)  # (index, size on disk) != the expected size
    # the facts of each watched path whose size matched (the caller may hash it)
    watched: dict[int, StatFacts] = field(default_factory=dict)
    processes: int = 1  # how many processes did the work (the parent counts as one)

    def absorb(self, part: tuple[list[int], list[tuple[int, int]], dict[int, StatFacts]]) -> None:
        missing, resized, watched = part
        self.missing.extend(missing)
        self.resized.extend(resized)
        self.watched.update(watched)


def survey_slice(
    paths: Sequence[str], sizes: Sequence[int | None], watch: Collection[int], start: int, stop: int
) -> tuple[list[int], list[tuple[int, int]], dict[int, StatFacts]]:
    """The exceptions among `paths[start:stop]`: gone, another size than `sizes` says (None: any size), or
    watched (the caller wants their times: libraries it may hash)."""
    missing: list[int] = []
    resized: list[tuple[int, int]] = []
    watched: dict[int, StatFacts] = {}
    stat = os.stat
    for index in range(start, stop):
        try:
            st = stat(paths[index])
        except OSError:
            missing.append(index)
            continue
        expected = sizes[index]
        if expected is not None and expected != st.st_size:
            resized.append((index, st.st_size))
        elif index in watch:
            watched[index] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return missing, resized, watched


def usable_cpus() -> int:
    """CPUs this process may run on (a container's or taskset's limit, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def process_count(paths: int, limit: int | None = None) -> int:
    """How many processes to survey `paths` paths with: one per PATHS_PER_PROCESS, at most MAX_PROCESSES (or
    `limit`) and the usable CPUs; one where this process cannot fork safely."""
    wanted = min(MAX_PROCESSES if limit is None else limit, usable_cpus(), max(1, paths // PATHS_PER_PROCESS))
    if wanted <= 1 or not hasattr(os, "fork") or threading.active_count() > 1:
        return 1
    return wanted


def survey(
    paths: Sequence[str],
    sizes: Sequence[int | None],
    watch: Collection[int] = (),
    processes: int | None = None,
) -> Survey:
    """`survey_slice` over every path, split between `process_count` processes (`processes`: at most that many)."""
    count = process_count(len(paths), processes)
    result = Survey(processes=count)
    if count == 1:
        result.absorb(survey_slice(paths, sizes, watch, 0, len(paths)))
        return result
    step = -(-len(paths) // count)
    bounds = [(start, min(start + step, len(paths))) for start in range(0, len(paths), step)]
    children: list[tuple[int, int, int, int]] = []  # pid, read end, start, stop
    try:
        for start, stop in bounds[1:]:
            child = _fork_slice(paths, sizes, watch, start, stop)
            if child is None:  # could not fork: this slice is the parent's too
                result.absorb(survey_slice(paths, sizes, watch, start, stop))
            else:
                children.append((*child, start, stop))
        result.absorb(survey_slice(paths, sizes, watch, *bounds[0]))
        while children:
            pid, read_end, start, stop = children[0]
            part = _collect(pid, read_end)
            children.pop(0)
            result.absorb(part if part is not None else survey_slice(paths, sizes, watch, start, stop))
    finally:
        for pid, read_end, _, _ in children:  # after an interruption: no child left behind
            _close_and_wait(pid, read_end)
    return result


def _fork_slice(
    paths: Sequence[str], sizes: Sequence[int | None], watch: Collection[int], start: int, stop: int
) -> tuple[int, int] | None:
    """Start a child that surveys one slice and writes its exceptions (marshal) to a pipe: (pid, read end)."""
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
            for (
                number
            ) in CHILD_DEFAULT_SIGNALS:  # the parent's handlers (a lock's clean-up) are not the child's
                signal.signal(number, signal.SIG_DFL)
            os.close(read_end)
            data = marshal.dumps(survey_slice(paths, sizes, watch, start, stop))
            view = memoryview(data)
            while view:
                view = view[os.write(write_end, view) :]
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    return pid, read_end


def _collect(pid: int, read_end: int) -> tuple[list[int], list[tuple[int, int]], dict[int, StatFacts]] | None:
    """A child's exceptions, or None when it failed (the caller then does the slice itself)."""
    chunks: list[bytes] = []
    try:
        while chunk := os.read(read_end, 1 << 20):
            chunks.append(chunk)
    except OSError:
        chunks = []
    status = _close_and_wait(pid, read_end)
    if status != 0 or not chunks:
        return None
    try:
        part = marshal.loads(b"".join(chunks))
    except (EOFError, ValueError, TypeError):
        return None
    return part if isinstance(part, tuple) and len(part) == 3 else None


def _close_and_wait(pid: int, read_end: int) -> int | None:
    """Close our end of the pipe (a child still writing then ends on EPIPE) and reap the child: its exit code."""
    with contextlib.suppress(OSError):
        os.close(read_end)
    try:
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    except ChildProcessError:
        return None
