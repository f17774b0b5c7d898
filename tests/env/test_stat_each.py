"""`stat_each`: the RECORD audit's stat of every file, threaded for many paths, must answer as one loop does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dflash_doctor.env import record_audit


def _paths(tmp_path: Path, count: int) -> list[str]:
    """`count` paths in a few folders, every third one never written (a file gone)."""
    paths = []
    for index in range(count):
        folder = tmp_path / f"pkg{index % 5}"
        folder.mkdir(exist_ok=True)
        path = folder / f"f{index}.py"
        if index % 3:
            path.write_bytes(b"x" * index)
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("threads_from", [10**9, 7])  # one thread; threads for anything over 7 paths
def test_stat_each_answers_as_one_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads_from: int
) -> None:
    monkeypatch.setattr(record_audit, "PARALLEL_STAT_MIN", threads_from)
    monkeypatch.setattr(record_audit, "STAT_THREADS", 8)
    monkeypatch.setattr(record_audit.os, "cpu_count", lambda: 4)
    paths = _paths(tmp_path, 61)  # not a multiple of any slice count: the last slice is short
    got = record_audit.stat_each(paths)
    assert len(got) == len(paths)
    for path, st in zip(paths, got, strict=True):
        if os.path.exists(path):
            assert (
                st is not None and st.st_ino == os.stat(path).st_ino and st.st_size == os.path.getsize(path)
            )
        else:
            assert st is None


def test_stat_each_uses_threads_only_for_many_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool for 61 paths when the threshold is 7; none below the threshold."""
    started: list[int] = []
    real_pool = record_audit.ThreadPoolExecutor

    def counting_pool(workers: int) -> object:
        started.append(workers)
        return real_pool(workers)

    monkeypatch.setattr(record_audit, "ThreadPoolExecutor", counting_pool)
    monkeypatch.setattr(record_audit, "STAT_THREADS", 8)
    monkeypatch.setattr(record_audit.os, "cpu_count", lambda: 4)
    paths = _paths(tmp_path, 61)
    monkeypatch.setattr(record_audit, "PARALLEL_STAT_MIN", 100)
    record_audit.stat_each(paths)
    assert started == []
    monkeypatch.setattr(record_audit, "PARALLEL_STAT_MIN", 7)
    record_audit.stat_each(paths)
    assert started == [4]  # capped by the cores
    assert record_audit.stat_each([]) == []


def test_the_shipped_default_starts_no_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """STAT_THREADS = 1 (threads were no faster where measured): many paths, many cores, still one loop."""
    started: list[int] = []
    monkeypatch.setattr(record_audit, "ThreadPoolExecutor", lambda workers: started.append(workers))
    monkeypatch.setattr(record_audit, "PARALLEL_STAT_MIN", 7)
    monkeypatch.setattr(record_audit.os, "cpu_count", lambda: 16)
    assert len(record_audit.stat_each(_paths(tmp_path, 61))) == 61
    assert started == []
