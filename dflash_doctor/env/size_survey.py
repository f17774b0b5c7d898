"""Stat every file the RECORDs list and report only what differs, in a few forked processes.

A warm `check` on a GPU host's environment (~50k files in RECORDs) spends most of its own time here: ~3 µs a
`stat`, and as much again in the Python loop around it. Each slice of the rows goes to a forked process
(`forked.start_slices`; threads lose here, an H200 host: one loop 166 ms, 8 threads 409 ms), which picks the
audited rows, compares the sizes itself and sends back only the exceptions, by (RECORD, row) position. The
parent hands over each distribution's rows as they are: it never walks the ~50k rows itself, so its work grows
with what is wrong, not with the size of the environment, and it writes none of the pages it shares with the
children (a write there costs it a copy of the page). A contiguous slice keeps a package's files, which share
folders, together.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from dflash_doctor.env.forked import Started, process_count, start_slices

# Below this many rows a slice is not worth a process: a fork, exit and wait of a process holding a 50k-file
# environment cost ~2 ms on a 2-core box (~25 ms of stat work at ~3 µs a path).
PATHS_PER_PROCESS = 8192
# At most this many processes: 4 slices of ~12k paths on an H200 host's 16 cores (S21's H200: one process
# 111 ms, 2 90 ms, 4 51 ms, 8 30 ms warm; bench/check/stat_survey.py in check_h200.sh).
MAX_PROCESSES = 4

StatFacts = tuple[int, int, int]  # size, mtime_ns, ctime_ns
RowRef = tuple[int, int]  # (which row list, which row in it)
Row = tuple[str, "str | None", "int | None"]  # a RECORD row: path, hash, size
# one slice's answer: missing, resized (ref, size on disk), watched (ref, facts), rows checked
Part = tuple[list[RowRef], list[tuple[int, int, int]], list[tuple[int, int, int, int, int]], int]

PYCACHE = f"{os.sep}__pycache__{os.sep}"


def is_audited(row: Row, record: str) -> bool:
    """A RECORD row worth checking: no bytecode (rewritten at will), not the RECORD itself, not hashless."""
    path = row[0]
    return row[1] is not None and path != record and not path.endswith(".pyc") and PYCACHE not in path


def is_shared_library(path: str) -> bool:
    """`libfoo.so`, `libfoo.so.2`: the files the RECORD audit may hash (the substring test first: ~50k calls)."""
    if ".so" not in path:
        return False
    name = os.path.basename(path)
    return name.endswith(".so") or ".so." in name


@dataclass
class Survey:
    """What the `stat` of every audited row found, by (row list, row) position."""

    missing: list[RowRef] = field(default_factory=list)  # the stat failed: the file is gone (or unreadable)
    resized: list[tuple[RowRef, int]] = field(default_factory=list)  # size on disk != the RECORD's
    # the facts of each watched path whose size matched (the caller may hash it)
    watched: dict[RowRef, StatFacts] = field(default_factory=dict)
    checked: int = 0  # audited rows stat'ed
    processes: int = 1  # how many processes did the work (the parent counts as one)
    beside: bool = False  # done in children started before it was asked for (`start_survey`)

    def absorb(self, part: Part) -> None:
        missing, resized, watched, checked = part
        self.missing.extend((ref[0], ref[1]) for ref in missing)
        self.resized.extend(((list_no, row_no), size) for list_no, row_no, size in resized)
        self.watched.update(((list_no, row_no), (size, m, c)) for list_no, row_no, size, m, c in watched)
        self.checked += checked


def survey_slice(
    row_lists: Sequence[Sequence[Row]],
    records: Sequence[str],
    offsets: Sequence[int],
    watch: Callable[[str], bool],
    start: int,
    stop: int,
) -> Part:
    """The exceptions among the audited rows at flat positions [start, stop) of the row lists laid end to end
    (`offsets`: where each list starts): gone, another size than the row says (None: any size), or watched
    (`watch(path)`: the caller wants their times, for libraries it may hash). `records[i]`: list i's RECORD."""
    missing: list[RowRef] = []
    resized: list[tuple[int, int, int]] = []
    watched: list[tuple[int, int, int, int, int]] = []
    checked = 0
    stat = os.stat
    list_no = max(0, bisect.bisect_right(offsets, start) - 1)
    while list_no < len(row_lists) and offsets[list_no] < stop:
        rows, base, record = row_lists[list_no], offsets[list_no], records[list_no]
        for row_no in range(max(0, start - base), min(len(rows), stop - base)):
            row = rows[row_no]
            path = row[0]
            if row[1] is None or path == record or path.endswith(".pyc") or PYCACHE in path:
                continue  # not audited (`is_audited`, inlined: ~50k rows)
            checked += 1
            try:
                st = stat(path)
            except OSError:
                missing.append((list_no, row_no))
                continue
            expected = row[2]
            if expected is not None and expected != st.st_size:
                resized.append((list_no, row_no, st.st_size))
            elif watch(path):
                watched.append((list_no, row_no, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        list_no += 1
    return missing, resized, watched, checked


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
    row_lists: Sequence[Sequence[Row]],
    records: Sequence[str],
    watch: Callable[[str], bool] = is_shared_library,
    processes: int | None = None,
) -> Survey:
    """`survey_slice` over every row, in up to MAX_PROCESSES forked processes (`processes`: at most that many)
    or, for one process's worth, in this one; the answer waited for."""
    return start_survey(row_lists, records, watch, processes, alone_in_a_child=False).result()


def start_survey(
    row_lists: Sequence[Sequence[Row]],
    records: Sequence[str],
    watch: Callable[[str], bool] = is_shared_library,
    processes: int | None = None,
    alone_in_a_child: bool = True,
) -> SurveyRun:
    """`survey`, every slice in a forked child started now, so the stat runs beside this process's other work
    (one child at least, for PATHS_PER_PROCESS rows or more, unless `alone_in_a_child` is false). As many
    children as CPUs, though this process runs beside them: a first `check` with the page cache dropped waits
    for the disk, and on a 2-core box two children took it from 1.20-1.27 s to 0.98-1.00 s, while a warm one
    (CPU-bound) was 0.25 s either way. Where forking is not safe, or for fewer rows, the work is done when the
    result is asked for. Only the lists' lengths are read here."""
    offsets = [0, *accumulate(len(rows) for rows in row_lists)]
    total = offsets.pop()
    count = process_count(total, PATHS_PER_PROCESS, MAX_PROCESSES if processes is None else processes)
    fork = total >= PATHS_PER_PROCESS and (alone_in_a_child or count > 1)
    started = start_slices(
        lambda start, stop: survey_slice(row_lists, records, offsets, watch, start, stop),
        total,
        count,
        fork=fork,
    )
    return SurveyRun(started)
