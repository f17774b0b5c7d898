"""`size_survey`: the RECORD audit's stat of every file, in forked processes for many paths, must answer
exactly as one loop in this process does, and fall back to that loop whenever a child cannot help."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from dflash_doctor.env import size_survey


def _tree(tmp_path: Path, count: int) -> tuple[list[str], list[int | None], frozenset[int]]:
    """`count` paths in a few folders: every third never written (gone), every fifth with a wrong expected
    size, every seventh with no expected size; every fourth watched."""
    paths: list[str] = []
    sizes: list[int | None] = []
    for index in range(count):
        folder = tmp_path / f"pkg{index % 5}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"f{index}.py"
        if index % 3:
            path.write_bytes(b"x" * index)
        paths.append(str(path))
        sizes.append(None if index % 7 == 0 else index + (1 if index % 5 == 0 else 0))
    return paths, sizes, frozenset(range(0, count, 4))


def _expected(paths: list[str], sizes: list[int | None], watch: frozenset[int]) -> size_survey.Survey:
    """The answer written out plainly, from os.path calls."""
    want = size_survey.Survey()
    for index, path in enumerate(paths):
        if not os.path.exists(path):
            want.missing.append(index)
        elif sizes[index] is not None and sizes[index] != os.path.getsize(path):
            want.resized.append((index, os.path.getsize(path)))
        elif index in watch:
            st = os.stat(path)
            want.watched[index] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return want


def _survey_is_complete(tmp_path: Path, processes: int) -> size_survey.Survey:
    """Survey a fresh `_tree` and check the answer against `_expected`, whatever the children did."""
    paths, sizes, watch = _tree(tmp_path, 61)  # not a multiple of any slice count: the last slice is short
    got = size_survey.survey(paths, sizes, watch, processes=processes)
    want = _expected(paths, sizes, watch)
    assert (sorted(got.missing), sorted(got.resized), got.watched) == (
        want.missing,
        want.resized,
        want.watched,
    )
    assert want.missing and want.resized and want.watched  # the tree has every kind of exception
    return got


@pytest.fixture
def forkable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small slices are worth a process, 4 CPUs are usable, no other thread runs (whatever the test runner
    has started)."""
    monkeypatch.setattr(size_survey, "PATHS_PER_PROCESS", 7)
    monkeypatch.setattr(size_survey, "usable_cpus", lambda: 4)
    monkeypatch.setattr(size_survey.threading, "active_count", lambda: 1)


@pytest.mark.parametrize("processes", [1, 3, 4])
def test_survey_answers_as_one_loop(tmp_path: Path, forkable: None, processes: int) -> None:
    assert _survey_is_complete(tmp_path, processes).processes == processes


def test_no_child_is_left_behind(tmp_path: Path, forkable: None, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []
    real_fork = os.fork

    def counting_fork() -> int:
        pid = real_fork()
        if pid:
            started.append(pid)
        return pid

    monkeypatch.setattr(size_survey.os, "fork", counting_fork)
    paths, sizes, watch = _tree(tmp_path, 61)
    assert size_survey.survey(paths, sizes, watch).processes == 4
    assert len(started) == 3  # the parent does the first slice itself
    for pid in started:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # already reaped


def test_a_failing_child_has_its_slice_done_by_the_parent(
    tmp_path: Path, forkable: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The children cannot encode their answer (they exit 1); the parent's answer is still complete."""

    def broken_dumps(value: object) -> bytes:
        raise ValueError("unmarshallable")

    monkeypatch.setattr(size_survey.marshal, "dumps", broken_dumps)
    _survey_is_complete(tmp_path, processes=4)


def test_a_failed_fork_is_done_in_this_process(
    tmp_path: Path, forkable: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_fork() -> int:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(size_survey.os, "fork", no_fork)
    _survey_is_complete(tmp_path, processes=4)


def test_process_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(size_survey, "PATHS_PER_PROCESS", 100)
    monkeypatch.setattr(size_survey, "usable_cpus", lambda: 16)
    monkeypatch.setattr(size_survey.threading, "active_count", lambda: 1)
    assert size_survey.process_count(99) == 1  # one slice's worth: no fork
    assert size_survey.process_count(250) == 2
    assert size_survey.process_count(50_000) == size_survey.MAX_PROCESSES
    assert size_survey.process_count(50_000, limit=2) == 2
    monkeypatch.setattr(size_survey, "usable_cpus", lambda: 2)
    assert size_survey.process_count(50_000) == 2  # the CPUs this process may use
    monkeypatch.setattr(size_survey.threading, "active_count", lambda: 3)
    assert size_survey.process_count(50_000) == 1  # another thread runs: forking is not safe


def test_empty_and_tiny_inputs(tmp_path: Path, forkable: None) -> None:
    assert size_survey.survey([], []).missing == []
    paths, sizes, watch = _tree(tmp_path, 3)
    got = size_survey.survey(paths, sizes, watch, processes=4)
    assert got.processes == 1  # fewer paths than a slice
    assert got.missing == [0]


def test_a_child_never_runs_the_parents_signal_handlers(
    tmp_path: Path, forkable: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child interrupted mid-slice dies as a plain process would: the parent's SIGTERM handler (which
    could remove a lock or write a record) runs in the parent only."""
    import signal

    handled = tmp_path / "handled"  # the handler leaves a file: seen whichever process ran it
    previous = signal.signal(signal.SIGTERM, lambda number, frame: handled.write_text(str(os.getpid())))
    parent, original = os.getpid(), size_survey.survey_slice

    def slice_that_is_terminated(*args: Any) -> Any:
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)  # the child: default action, it dies here
        return original(*args)

    monkeypatch.setattr(size_survey, "survey_slice", slice_that_is_terminated)
    try:
        _survey_is_complete(tmp_path / "tree", processes=4)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not handled.exists()  # not in a child (they died of it), and nobody signalled the parent
