"""Issue 58, W2 and N6: a child we start dies with us, whatever kills us (SIGKILL included), and the warm-up
child of `cache warm` holds the cache folder's lock while it lives.

W2: SIGKILL of `cache warm` left its compile child running with no lock; a restore then printed "verified" and
the orphan added 25 files to that cache. N6: SIGKILL of `train`'s launcher left torchrun and the workers
running to the end, holding the GPUs."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from dflash_base.errors import DoctorError
from dflash_doctor.cache.folder_lock import folder_lock

BOUND_S = 10.0


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def sleeper(pid_file: Path) -> list[str]:
    """A child that writes its pid, then sleeps a minute."""
    code = f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n"
    return [sys.executable, "-c", code]


def in_a_helper(work: Callable[[], object]) -> int:
    """Fork a process that runs `work` (it starts the child and waits for it); its pid, to SIGKILL it."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the helper
        code = 0
        try:
            work()
        except BaseException:
            code = 1
        os._exit(code)
    return pid


def child_pid(pid_file: Path) -> int:
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        if pid_file.is_file() and pid_file.read_text():
            return int(pid_file.read_text())
        time.sleep(0.05)
    raise AssertionError("the child never started")


def kill_outright(helper: int) -> None:
    os.kill(helper, signal.SIGKILL)
    os.waitpid(helper, 0)


def gone_within(pid: int, seconds: float = BOUND_S) -> bool:
    deadline = time.monotonic() + seconds
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not running(pid)


def test_w2_the_warm_up_child_dies_with_cache_warm(tmp_path: Path) -> None:
    """`run_child` (the warm-up child, the deep probe) with its parent killed outright."""
    from dflash_doctor.processes import run_child

    pid_file = tmp_path / "child.pid"
    helper = in_a_helper(lambda: run_child(sleeper(pid_file), 120, "warm-up"))
    child = child_pid(pid_file)
    kill_outright(helper)
    try:
        assert gone_within(child), "the child outlived its parent killed with SIGKILL"
    finally:
        if running(child):
            os.kill(child, signal.SIGKILL)


def test_w2_the_warm_up_child_holds_the_caches_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`cache warm` killed while its child still runs (here the child is made to outlive it, as a straggler
    would): the cache's lock stays held until the child is gone, so no restore swaps the folder under it."""
    from dflash_doctor.cli import run
    from dflash_doctor.commands import cache as cache_command

    cache = tmp_path / "caches" / "inductor"
    cache.mkdir(parents=True)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DFLASH_DOCTOR_LOCK_DIR", str(tmp_path / "locks"))
    pid_file = tmp_path / "child.pid"

    def warm_in_helper() -> object:
        import dflash_doctor.processes as processes

        processes.dying_with_us = lambda command, *args, **kwargs: list(
            command
        )  # the child outlives the helper
        monkeypatch.setattr(cache_command, "child_command", lambda *args, **kwargs: sleeper(pid_file))
        return run(["cache", "warm", "--no-snapshot"])

    helper = in_a_helper(warm_in_helper)
    child = child_pid(pid_file)
    kill_outright(helper)
    try:
        assert running(child)
        with (
            pytest.raises(DoctorError, match="another dflash-doctor command is using"),
            folder_lock(cache, 0.3),
        ):
            pass  # a restore (from any home) waits for the child
    finally:
        os.kill(child, signal.SIGKILL)
    assert gone_within(child)
    with folder_lock(cache, 5.0):  # free once the child is gone
        pass


def test_n6_torchrun_dies_with_the_launcher(tmp_path: Path) -> None:
    """`run_torchrun` (what `train` supervises torchrun and a direct rank with) with the launcher killed
    outright: torchrun gets SIGTERM (it stops its workers on it), here a stand-in that only sleeps."""
    from dflash_doctor.launch.supervise import run_torchrun

    pid_file = tmp_path / "child.pid"
    helper = in_a_helper(lambda: run_torchrun(sleeper(pid_file), dict(os.environ)))
    child = child_pid(pid_file)
    kill_outright(helper)
    try:
        assert gone_within(child), "torchrun outlived its launcher killed with SIGKILL"
    finally:
        if running(child):
            os.kill(child, signal.SIGKILL)


def test_n6_runs_says_a_lost_runs_workers_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The launcher killed outright (its record `lost`), the workers went on and wrote their summary.json:
    `runs` says so instead of `lost` alone."""
    import socket
    import subprocess

    from dflash_doctor.cli import run
    from dflash_doctor.launch.runs import RunStore

    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "out"
    out.mkdir()
    store = RunStore()
    lost = store.create(
        "running", host=socket.gethostname(), launcher_pid=dead.pid, launcher_started=1.0, output_dir=str(out)
    )
    assert run(["runs"]) == 0
    assert "finished" not in capsys.readouterr().out  # no summary yet: lost, nothing more
    (out / "summary.json").write_text('{"steps": 3}')
    assert run(["runs", "show", lost.id]) == 0
    shown = capsys.readouterr().out
    assert "lost (last seen" in shown and "its workers finished" in shown and "summary.json" in shown
