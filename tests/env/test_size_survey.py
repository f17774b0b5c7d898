"""`size_survey`: the RECORD audit's stat of every file, in forked processes for many paths, must answer
exactly as one loop in this process does (the fork machinery's own tests: test_forked.py)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from dflash_doctor.env import forked, size_survey

Rows = list[list[tuple[str, "str | None", "int | None"]]]


def _tree(tmp_path: Path, count: int) -> tuple[Rows, list[str], frozenset[str]]:
    """`count` audited rows in a few folders, cut into RECORD row lists of uneven lengths (one empty): every
    third file never written (gone), every fifth with a wrong size in its row, every seventh with none; every
    fourth watched. Each list also has rows the audit skips: its RECORD, a hashless row, bytecode."""
    flat: list[tuple[str, str | None, int | None]] = []
    for index in range(count):
        folder = tmp_path / f"pkg{index % 5}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"f{index}.py"
        if index % 3:
            path.write_bytes(b"x" * index)
        flat.append((str(path), "sha", None if index % 7 == 0 else index + (1 if index % 5 == 0 else 0)))
    cuts = [0, count // 6, count // 6, count // 2, count]  # the second list is empty
    rows: Rows = []
    records: list[str] = []
    for number, (begin, end) in enumerate(itertools.pairwise(cuts)):
        record = str(tmp_path / f"d{number}.dist-info" / "RECORD")  # never written: skipped, not missing
        skipped = [(record, None, None), (str(tmp_path / "gone-hashless"), None, None)]
        skipped.append((str(tmp_path / "pkg0" / "__pycache__" / "f.cpython-311.pyc"), "sha", 1))
        rows.append([*skipped[:1], *flat[begin:end], *skipped[1:]])
        records.append(record)
    return rows, records, frozenset(row[0] for row in flat[::4])


def _expected(rows: Rows, records: list[str], watch: frozenset[str]) -> size_survey.Survey:
    """The answer written out plainly, from os.path calls."""
    want = size_survey.Survey()
    for list_no, listed in enumerate(rows):
        for row_no, (path, digest, size) in enumerate(listed):
            if digest is None or path == records[list_no] or path.endswith(".pyc"):
                continue
            want.checked += 1
            if not os.path.exists(path):
                want.missing.append((list_no, row_no))
            elif size is not None and size != os.path.getsize(path):
                want.resized.append(((list_no, row_no), os.path.getsize(path)))
            elif path in watch:
                st = os.stat(path)
                want.watched[(list_no, row_no)] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return want


def _same(got: size_survey.Survey, want: size_survey.Survey) -> None:
    assert (sorted(got.missing), sorted(got.resized), got.watched, got.checked) == (
        want.missing,
        want.resized,
        want.watched,
        want.checked,
    )


def _survey_is_complete(tmp_path: Path, processes: int) -> size_survey.Survey:
    """Survey a fresh `_tree` and check the answer against `_expected`, whatever the children did."""
    rows, records, watch = _tree(tmp_path, 61)  # not a multiple of any slice count: the last slice is short
    got = size_survey.survey(rows, records, watch.__contains__, processes=processes)
    want = _expected(rows, records, watch)
    _same(got, want)
    assert want.missing and want.resized and want.watched and want.checked == 61  # every kind of exception
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


def test_empty_and_tiny_inputs(tmp_path: Path, forkable: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(size_survey, "PATHS_PER_PROCESS", 64)
    assert size_survey.survey([], []).missing == []
    assert size_survey.survey([[], []], ["", ""], processes=4).checked == 0
    rows, records, watch = _tree(tmp_path, 3)
    got = size_survey.survey(rows, records, watch.__contains__, processes=4)
    assert got.processes == 1  # fewer rows than a slice
    _same(got, _expected(rows, records, watch))
    assert got.missing == [(2, 1)]  # f0, gone: the third list's row after its RECORD's


@pytest.mark.parametrize("processes", [1, 3, 4])
def test_a_started_survey_answers_as_one_loop(tmp_path: Path, forkable: None, processes: int) -> None:
    """Started beside other work, every slice in a child (one child at least): the same answer."""
    rows, records, watch = _tree(tmp_path, 61)
    run = size_survey.start_survey(rows, records, watch.__contains__, processes=processes)
    assert run.started.children == processes  # the children run before anyone asks for the result
    got = run.result()
    _same(got, _expected(rows, records, watch))
    assert got.processes == processes


def test_a_started_survey_of_few_paths_forks_nothing(
    tmp_path: Path, forkable: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(size_survey, "PATHS_PER_PROCESS", 64)
    rows, records, watch = _tree(tmp_path, 5)  # fewer than a slice: the answer is worked out when asked for
    run = size_survey.start_survey(rows, records, watch.__contains__)
    assert run.started.children == 0
    _same(run.result(), _expected(rows, records, watch))


def test_library_paths_are_watched_by_name() -> None:
    assert size_survey.is_shared_library("/site/nvidia/nccl/lib/libnccl.so.2")
    assert size_survey.is_shared_library("/site/torch/lib/libtorch.so")
    assert not size_survey.is_shared_library("/site/torch/_C.pyi")
    assert not size_survey.is_shared_library("/site/pkg.so.d/notes.txt")  # `.so.` in a folder's name only
