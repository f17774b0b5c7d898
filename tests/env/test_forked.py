"""`forked.start_slices`: slices of a job in forked children must give what one process gives, in order, and
fall back to this process whenever a child cannot help; no child is left behind or runs our handlers."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from dflash_doctor.env import forked

REAL_THREAD_COUNT = forked.thread_count  # before the fixture below replaces it


def squares(start: int, stop: int) -> list[int]:
    """A job whose answer says which slice ran: the squares of its numbers."""
    return [n * n for n in range(start, stop)]


def joined(parts: list[list[int]]) -> list[int]:
    return [n for part in parts for n in part]


@pytest.fixture(autouse=True)
def no_other_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the test runner has started, forking counts as safe here."""
    monkeypatch.setattr(forked, "thread_count", lambda: 1)


@pytest.mark.parametrize("processes", [1, 2, 3, 7])
def test_slices_come_back_in_order(processes: int) -> None:
    parts = forked.start_slices(squares, 61, processes).results()  # 61: the last slice is short
    assert len(parts) == min(processes, 61) and joined(parts) == squares(0, 61)
    assert forked.start_slices(squares, 0, 4).results() == []


def test_no_child_is_left_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []
    real_fork = os.fork

    def counting_fork() -> int:
        pid = real_fork()
        if pid:
            started.append(pid)
        return pid

    monkeypatch.setattr(forked.os, "fork", counting_fork)
    assert joined(forked.start_slices(squares, 40, 4).results()) == squares(0, 40)
    assert len(started) == 4  # every slice in a child
    for pid in started:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # already reaped


def test_a_failing_child_has_its_slice_done_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The children cannot encode their answer (they exit 1): the answer is still whole."""

    def broken_dumps(value: object) -> bytes:
        raise ValueError("unmarshallable")

    monkeypatch.setattr(forked.marshal, "dumps", broken_dumps)
    assert joined(forked.start_slices(squares, 40, 4).results()) == squares(0, 40)


def test_a_failed_fork_is_done_here(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_fork() -> int:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(forked.os, "fork", no_fork)
    assert joined(forked.start_slices(squares, 40, 4).results()) == squares(0, 40)


def test_a_child_never_runs_the_parents_signal_handlers(tmp_path: Path) -> None:
    """A child interrupted mid-slice dies as a plain process would: the parent's SIGTERM handler (which could
    remove a lock or write a record) runs in the parent only."""
    handled = tmp_path / "handled"  # the handler leaves a file: seen whichever process ran it
    previous = signal.signal(signal.SIGTERM, lambda number, frame: handled.write_text(str(os.getpid())))
    parent = os.getpid()

    def terminated_in_a_child(start: int, stop: int) -> list[int]:
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)  # the child: default action, it dies here
        return squares(start, stop)

    try:
        assert joined(forked.start_slices(terminated_in_a_child, 40, 4).results()) == squares(0, 40)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not handled.exists()  # not in a child (they died of it), and nobody signalled the parent


def test_process_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forked, "usable_cpus", lambda: 16)
    assert forked.process_count(99, per_process=100, limit=4) == 1  # one slice's worth: no fork
    assert forked.process_count(250, per_process=100, limit=4) == 2
    assert forked.process_count(50_000, per_process=100, limit=4) == 4
    monkeypatch.setattr(forked, "usable_cpus", lambda: 2)
    assert forked.process_count(50_000, per_process=100, limit=4) == 2  # the CPUs this process may use
    monkeypatch.setattr(forked, "thread_count", lambda: 3)
    assert forked.process_count(50_000, per_process=100, limit=4) == 1  # another thread runs: not safe


def pids(start: int, stop: int) -> list[int]:
    """A job whose answer says which process ran it."""
    return [os.getpid()] * (stop - start)


def test_started_slices_run_in_children_before_anyone_asks() -> None:
    started = forked.start_slices(squares, 61, 3)
    assert started.children == 3  # all three forked at once: this process is free meanwhile
    assert joined(started.results()) == squares(0, 61)
    assert started.results() is started.results()  # collected once
    by_pid = forked.start_slices(pids, 9, 3).results()
    assert os.getpid() not in {pid for part in by_pid for pid in part}


def test_started_slices_without_a_fork_are_done_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    started = forked.start_slices(pids, 9, 3, fork=False)
    assert started.children == 0 and joined(started.results()) == [os.getpid()] * 9
    job = forked.start_job(os.getpid)
    assert job.children == 1 and job.results() != [os.getpid()]  # a job of its own, in a child
    monkeypatch.setattr(forked, "thread_count", lambda: 2)  # another thread runs: never fork
    job = forked.start_job(os.getpid)
    assert job.children == 0 and job.results() == [os.getpid()]


def test_a_started_job_nobody_collects_is_ended_and_reaped() -> None:
    def forever(start: int, stop: int) -> list[int]:
        import time

        time.sleep(60)
        return []

    started = forked.start_slices(forever, 4, 2)
    children = [pid for pid, _ in started._children.values()]
    assert len(children) == 2
    started.cancel()
    for pid in children:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # killed and reaped: no zombie, no sleeper left


def test_a_started_child_that_fails_has_its_slice_done_here(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_dumps(value: object) -> bytes:
        raise ValueError("unmarshallable")

    monkeypatch.setattr(forked.marshal, "dumps", broken_dumps)
    started = forked.start_slices(pids, 6, 2)
    assert started.children == 2
    assert joined(started.results()) == [os.getpid()] * 6  # both slices redone in this process


def test_a_running_thread_forbids_the_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted from /proc/self/task where there is one (a native library's threads too), else by `threading`."""
    import threading

    monkeypatch.setattr(forked, "thread_count", REAL_THREAD_COUNT)
    before = forked.thread_count()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert forked.thread_count() == before + 1 and not forked.can_fork()
        assert forked.start_job(os.getpid).children == 0  # done here instead, when asked
    finally:
        stop.set()
        thread.join()


def test_a_hung_child_is_killed_and_its_slice_done_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child that never answers (a lock held at the fork by a thread nobody saw) costs the deadline, not
    forever: it is killed, reaped, and its slice is done in this process."""
    import time

    parent = os.getpid()

    def hangs_in_a_child(start: int, stop: int) -> list[int]:
        if os.getpid() != parent:
            time.sleep(60)
        return squares(start, stop)

    monkeypatch.setattr(forked, "CHILD_DEADLINE_S", 0.3)
    began = time.monotonic()
    started = forked.start_slices(hangs_in_a_child, 10, 2)
    children = [pid for pid, _ in started._children.values()]
    assert joined(started.results()) == squares(0, 10)
    assert time.monotonic() - began < 5
    for pid in children:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
