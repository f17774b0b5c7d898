"""`size_survey`: the RECORD audit's stat of every file, in forked processes for many paths, must answer
exactly as one loop in this process does (the fork machinery's own tests: test_forked.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dflash_doctor.env import forked, size_survey


def _tree(tmp_path: Path, count: int) -> tuple[list[str], list[int | None], frozenset[str]]:
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
    return paths, sizes, frozenset(paths[::4])


def _expected(paths: list[str], sizes: list[int | None], watch: frozenset[str]) -> size_survey.Survey:
    """The answer written out plainly, from os.path calls."""
    want = size_survey.Survey()
    for index, path in enumerate(paths):
        if not os.path.exists(path):
            want.missing.append(index)
        elif sizes[index] is not None and sizes[index] != os.path.getsize(path):
            want.resized.append((index, os.path.getsize(path)))
        elif path in watch:
            st = os.stat(path)
            want.watched[index] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return want


def _survey_is_complete(tmp_path: Path, processes: int) -> size_survey.Survey:
    """Survey a fresh `_tree` and check the answer against `_expected`, whatever the children did."""
    paths, sizes, watch = _tree(tmp_path, 61)  # not a multiple of any slice count: the last slice is short
    got = size_survey.survey(paths, sizes, watch.__contains__, processes=processes)
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
    monkeypatch.setattr(forked, "usable_cpus", lambda: 4)
    monkeypatch.setattr(forked, "thread_count", lambda: 1)


@pytest.mark.parametrize("processes", [1, 3, 4])
def test_survey_answers_as_one_loop(tmp_path: Path, forkable: None, processes: int) -> None:
    assert _survey_is_complete(tmp_path, processes).processes == processes


def test_empty_and_tiny_inputs(tmp_path: Path, forkable: None) -> None:
    assert size_survey.survey([], []).missing == []
    paths, sizes, watch = _tree(tmp_path, 3)
    got = size_survey.survey(paths, sizes, watch.__contains__, processes=4)
    assert got.processes == 1  # fewer paths than a slice
    assert got.missing == [0]


@pytest.mark.parametrize("processes", [1, 3, 4])
def test_a_started_survey_answers_as_one_loop(tmp_path: Path, forkable: None, processes: int) -> None:
    """Started beside other work, every slice in a child (one child at least): the same answer."""
    paths, sizes, watch = _tree(tmp_path, 61)
    run = size_survey.start_survey(paths, sizes, watch.__contains__, processes=processes)
    assert run.started.children == processes  # the children run before anyone asks for the result
    got, want = run.result(), _expected(paths, sizes, watch)
    assert (sorted(got.missing), sorted(got.resized), got.watched) == (
        want.missing,
        want.resized,
        want.watched,
    )
    assert got.processes == processes


def test_a_started_survey_of_few_paths_forks_nothing(tmp_path: Path, forkable: None) -> None:
    paths, sizes, watch = _tree(tmp_path, 5)  # fewer than a slice: the answer is worked out when asked for
    run = size_survey.start_survey(paths, sizes, watch.__contains__)
    assert run.started.children == 0
    assert sorted(run.result().missing) == _expected(paths, sizes, watch).missing


def test_library_paths_are_watched_by_name() -> None:
    assert size_survey.is_shared_library("/site/nvidia/nccl/lib/libnccl.so.2")
    assert size_survey.is_shared_library("/site/torch/lib/libtorch.so")
    assert not size_survey.is_shared_library("/site/torch/_C.pyi")
    assert not size_survey.is_shared_library("/site/pkg.so.d/notes.txt")  # `.so.` in a folder's name only
