"""Children that leave grandchildren holding their output: the call still ends on time and nothing survives.

The story: the deep probe and the warm-up child ran under `subprocess.run(capture_output=True, timeout=...)`;
a grandchild (an Inductor compile worker) holding stdout kept `run` reading past its timeout, and lived on.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dflash_base.errors import DoctorError
from dflash_doctor.cache.warm import run_warm_child
from dflash_doctor.deep.run import run_probe
from dflash_doctor.processes import ChildTimedOut, run_child

REPO = Path(__file__).resolve().parents[1]
BOUND_S = 15.0  # timeout + grace + reaping, with room for a loaded 2-core machine


def spawner(pids: Path, grandchild_session: bool = False, child_waits: bool = True) -> list[str]:
    """A child that starts a sleeping grandchild inheriting its stdout/stderr, records both pids, and
    then sleeps (or exits at once)."""
    code = (
        "import os, subprocess, sys, time\n"
        f"g = subprocess.Popen(['sleep', '60'], start_new_session={grandchild_session})\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{g.pid}}')\n"
        "print('child started', flush=True)\n"
        "print('child says hello on stderr', file=sys.stderr, flush=True)\n"
        + ("time.sleep(60)\n" if child_waits else "")
    )
    return [sys.executable, "-c", code]


def shell_spawner(tmp_path: Path, pids: Path) -> str:
    """An executable standing in for an interpreter: whatever its arguments, it leaves `sleep` holding
    its stdout and sleeps itself."""
    script = tmp_path / "fake-python"
    script.write_text(f"#!/bin/sh\nsleep 60 &\necho $$ $! > {pids}\necho started\nsleep 60\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def group_members(pgid: int) -> list[int]:
    """Living processes whose process group is `pgid`."""
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def assert_all_gone(pids: Path) -> None:
    child, grandchild = (int(p) for p in pids.read_text().split())
    deadline = time.monotonic() + 5  # init reaps the reparented grandchild on its own schedule
    while (running(grandchild) or running(child) or group_members(child)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(child), "the child outlived the call"
    assert not running(grandchild), "the grandchild outlived the call"
    assert group_members(child) == [], "a process of the child's group outlived the call"


def test_a_timeout_returns_on_time_though_a_grandchild_holds_stdout(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    start = time.monotonic()
    with pytest.raises(ChildTimedOut) as raised:
        run_child(spawner(pids), 1.0, "the test child", hint="make it faster")
    assert time.monotonic() - start < BOUND_S
    assert "the test child did not finish within 1 s" in raised.value.message
    assert raised.value.hint == "make it faster" and raised.value.exit_code == 2  # a DoctorError: exit 2
    assert "child started" in raised.value.stdout and "hello on stderr" in raised.value.stderr
    assert_all_gone(pids)


def test_a_grandchild_in_a_session_of_its_own_is_stopped_too(tmp_path: Path) -> None:
    """Out of the child's process group, so only the remembered tree finds it."""
    pids = tmp_path / "pids"
    with pytest.raises(ChildTimedOut):
        run_child(spawner(pids, grandchild_session=True), 1.0, "the test child")
    assert_all_gone(pids)


def test_a_child_that_ends_leaving_a_grandchild_returns_at_once(tmp_path: Path) -> None:
    """`subprocess.run` waits for EOF on its pipes: here it would block until the grandchild's 60 s sleep ends."""
    pids = tmp_path / "pids"
    start = time.monotonic()
    done = run_child(spawner(pids, child_waits=False), 30.0, "the test child")
    assert time.monotonic() - start < BOUND_S
    assert done.returncode == 0
    assert done.stdout.strip() == "child started"
    assert_all_gone(pids)


def test_a_quiet_child_is_quiet() -> None:
    done = run_child([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], 30.0, "the test child")
    assert (done.returncode, done.stdout, done.stderr) == (
        3,
        "out\n",
        "",
    )


class Interrupted(BaseException):
    """Stands in for KeyboardInterrupt / Stopped arriving while we wait for the child."""


def test_our_own_interruption_stops_the_child_and_its_grandchild(tmp_path: Path) -> None:
    pids = tmp_path / "pids"

    def interrupt(_signum: int, _frame: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.5)
    try:
        start = time.monotonic()
        with pytest.raises(Interrupted):
            run_child(spawner(pids), 60.0, "the test child")
        assert time.monotonic() - start < BOUND_S
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert_all_gone(pids)


def test_sigterm_to_a_command_stops_its_child_and_grandchild(tmp_path: Path) -> None:
    """The child has a session of its own, so a signal to us never reaches it: every command unwinds stop
    signals as `Stopped` (cli.py), and the unwinding stops the child's group. A subprocess stands in."""
    pids = tmp_path / "pids"
    parent = (
        "import sys\n"
        "from dflash_doctor.processes import run_child\n"
        "from dflash_base.stopping import Stopped, handling_stop_signals\n"
        "try:\n"
        "    with handling_stop_signals():\n"
        f"        run_child({spawner(pids)!r}, 60.0, 'the test child')\n"
        "except Stopped as stop:\n"
        "    sys.exit(stop.exit_code)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent], env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 30
        while not pids.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pids.exists(), "the child never started"
        time.sleep(0.3)  # the tree has seen the grandchild
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=BOUND_S) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    assert_all_gone(pids)


def test_the_deep_probe_times_out_into_a_report(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    start = time.monotonic()
    report = run_probe(shell_spawner(tmp_path, pids), timeout=1.0, inductor_cache=str(tmp_path / "ind"))
    assert time.monotonic() - start < BOUND_S
    assert not report.ran and report.error == (
        "the probe did not finish within 1 s; it was stopped with every process it started"
    )
    assert_all_gone(pids)


def test_the_warm_up_child_times_out_with_a_clear_error(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    start = time.monotonic()
    with pytest.raises(DoctorError, match="warm-up did not finish within 1 s") as raised:
        run_warm_child([shell_spawner(tmp_path, pids)], dict(os.environ), timeout=1.0)
    assert time.monotonic() - start < BOUND_S
    assert raised.value.hint == "run it alone, or with smaller shapes"
    assert_all_gone(pids)


def test_a_missing_program_is_an_oserror_for_the_caller(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        run_child([str(tmp_path / "nope")], 5.0, "nothing")
    with pytest.raises(DoctorError, match="could not start"):
        run_warm_child([str(tmp_path / "nope")], {}, timeout=5.0)
