"""Stat every file the RECORDs list and report only what differs, in a few forked processes.

A warm `check` on a GPU host's environment (~50k files in RECORDs) spends most of its own time here: ~3 µs a
`stat`, and as much again in the Python loop around it. Each slice of the paths goes to a forked process
(`forked.start_slices`; threads lose here, an H200 host: one loop 166 ms, 8 threads 409 ms), which compares the
sizes itself and sends back only the exceptions, so the parent's work grows with what is wrong, not with the
size of the environment. A contiguous slice keeps a package's files, which share folders, together.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dflash_doctor.env.forked import Started, process_count, start_slices

# Below this many paths a slice is not worth a process: a fork, exit and wait of a process holding a 50k-file
# environment cost ~2 ms on a 2-core box (~25 ms of stat work at ~3 µs a path).
PATHS_PER_PROCESS = 8192
# At most this many processes: 4 slices of ~12k paths on an H200 host's 16 cores (2 processes took 0.58x one
# process's time on a 2-core box; 4 on the H200 not measured yet: bench/check/stat_survey.py in check_h200.sh).
MAX_PROCESSES = 4

StatFacts = tuple[int, int, int]  # size, mtime_ns, ctime_ns
Part = tuple[list[int], list[tuple[int, int]], dict[int, StatFacts]]  # one slice's missing, resized, watched


@dataclass
class Survey:
    """What the `stat` of every path found, by index into the paths given."""

    missing: list[int] = field(default_factory=list)  # the stat failed: the file is gone (or unreadable)
    resized: list[tuple[int, int]] = field(default_factory=list)  # (index, size on disk) != the expected size
    # the facts of each watched path whose size matched (the caller may hash it)
    watched: dict[int, StatFacts] = field(default_factory=dict)
    processes: int = 1  # how many processes did the work (the parent counts as one)
    beside: bool = False  # done in children started before it was asked for (`start_survey`)

    def absorb(self, part: Part) -> None:
        missing, resized, watched = part
        self.missing.extend(missing)
        self.resized.extend(resized)
        self.watched.update(watched)


def survey_slice(
    paths: Sequence[str], sizes: Sequence[int | None], watch: Callable[[str], bool], start: int, stop: int
) -> Part:
    """The exceptions among `paths[start:stop]`: gone, another size than `sizes` says (None: any size), or
    watched (`watch(path)`: the caller wants their times, for libraries it may hash)."""
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
        elif watch(paths[index]):
            watched[index] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return missing, resized, watched


def is_shared_library(path: str) -> bool:
    """`libfoo.so`, `libfoo.so.2`: the files the RECORD audit may hash (the substring test first: ~50k calls)."""
    if ".so" not in path:
        return False
    name = os.path.basename(path)
    return name.endswith(".so") or ".so." in name


@dataclass
class SurveyRun:
    """A survey started in forked children (`start_survey`): this process is free until it asks for `result()`."""

    started: Started[Part]

    @property
    def processes(self) -> int:
        """How many processes do the stat: the children, or this one alone."""
        return max(1, self.started.children)

    def result(self) -> Survey:
        found = Survey(processes=self.processes, beside=self.started.children > 0)
        for part in self.started.results():
            found.absorb(part)
        return found

    def cancel(self) -> None:
        self.started.cancel()


def survey(
    paths: Sequence[str],
    sizes: Sequence[int | None],
    watch: Callable[[str], bool] = is_shared_library,
    processes: int | None = None,
) -> Survey:
    """`survey_slice` over every path, in up to MAX_PROCESSES forked processes (`processes`: at most that many)
    or, for one process's worth, in this one; the answer waited for."""
    return start_survey(paths, sizes, watch, processes, alone_in_a_child=False).result()


def start_survey(
    paths: Sequence[str],
    sizes: Sequence[int | None],
    watch: Callable[[str], bool] = is_shared_library,
    processes: int | None = None,
    alone_in_a_child: bool = True,
) -> SurveyRun:
    """`survey`, every slice in a forked child started now, so the stat runs beside this process's other work
    (one child at least, for PATHS_PER_PROCESS paths or more, unless `alone_in_a_child` is false). As many
    children as CPUs, though this process runs beside them: a first `check` with the page cache dropped waits
    for the disk, and on a 2-core box two children took it from 1.20-1.27 s to 0.98-1.00 s, while a warm one
    (CPU-bound) was 0.25 s either way. Where forking is not safe, or for fewer paths, the work is done when the
    result is asked for."""
    count = process_count(len(paths), PATHS_PER_PROCESS, MAX_PROCESSES if processes is None else processes)
    fork = len(paths) >= PATHS_PER_PROCESS and (alone_in_a_child or count > 1)
    started = start_slices(
        lambda start, stop: survey_slice(paths, sizes, watch, start, stop), len(paths), count, fork=fork
    )
    return SurveyRun(started)
