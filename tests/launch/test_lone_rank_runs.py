"""The real chain for a lone rank that is its own warm-up (issue 40 §2): `train` -> `python -m trainer` started
beside the gate, on CPU (tiny-cpu colocated, one process). It compiles into the managed cache, trains only on
the launcher's go to the same losses as the separate warm-up child's path, and leaves the same warm-up record;
a refusal after it started, a compile that fails and a launcher killed while it waits each leave nothing
running and nothing written. Slow: each launch imports torch and compiles (tests/launch/test_lone_rank.py covers
the launcher's side fast, with a stand-in rank)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dflash_doctor.launch.lone_rank import SEPARATE_ENV
from dflash_doctor.launch.runs import RunStore
from dflash_doctor.launch.timeline import EARLY_PHASES, PHASES
from tests.launch.test_direct_runs import REPO, environ, train_args

# A static check outside gate.WARM_UP_NEEDS, replaced in the launcher: it waits until the rank has compiled
# (its "compile" mark in the run's timeline), writes the rank's pid to LATE_SIGNAL, then fails (LATE_MODE=fail)
# or blocks (hang), so the rank is known to wait for its go when the launch is refused or the launcher killed.
LATE_DRIVER = r"""
import dataclasses, glob, json, os, sys, time
from pathlib import Path
from dflash_doctor import registry
from dflash_doctor.cli import main
from dflash_doctor.findings import Finding, Severity

HOME, SIGNAL = Path(os.environ["DFLASH_DOCTOR_HOME"]), Path(os.environ["LATE_SIGNAL"])


def compiled_rank():
    while True:
        for path in glob.glob(str(HOME / "state" / "runs" / "*" / "timeline.jsonl")):
            for line in Path(path).read_text().splitlines():
                try:
                    mark = json.loads(line)
                except ValueError:
                    continue
                if mark.get("phase") == "compile":
                    return mark["pid"]
        time.sleep(0.2)


def late(ctx):
    SIGNAL.write_text(str(compiled_rank()))
    if os.environ["LATE_MODE"] == "hang":
        time.sleep(3600)
    yield Finding("ownership.clobbered", Severity.FAIL, "planted once the rank had compiled", {}, "fix it")


registry.all_checks()
original = registry._CHECKS["ownership.clobbered"]
registry._CHECKS["ownership.clobbered"] = dataclasses.replace(original, fn=late)
sys.argv = ["dflash-doctor", *sys.argv[1:]]
main()
"""


def launch(out: Path, home: Path, *extra: str, **env: str) -> tuple[dict, str]:
    """One `train --json` to its end: its document and stderr."""
    command = [
        sys.executable,
        "-m",
        "dflash_doctor",
        *train_args(out, **{"optim.steps": "3"}),
        "--json",
        *extra,
    ]
    done = subprocess.run(
        command, cwd=REPO, env=environ(home, **env), capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), done.stderr


def losses(out: Path) -> list[float]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def warm_records(home: Path) -> list[dict]:
    path = home / "cache" / "warm-records.json"
    return json.loads(path.read_text())["records"] if path.is_file() else []


def gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow  # three real launches (the old path's with its warm-up child): ~3 minutes on a busy 2-core box
def test_the_rank_compiles_beside_the_gate_to_the_old_paths_losses_and_record(tmp_path: Path) -> None:
    old, _ = launch(tmp_path / "out-old", tmp_path / "home-old", **{SEPARATE_ENV: "1"})
    new, _ = launch(tmp_path / "out-new", tmp_path / "home-new")
    assert old["run"]["status"] == new["run"]["status"] == "succeeded"
    assert [r["phase"] for r in old["run"]["timeline"]["phases"]] == [
        p for p in PHASES if p != "torchrun start"
    ]  # the way back: the warm-up child, then the rank
    assert [r["phase"] for r in new["run"]["timeline"]["phases"]] == list(EARLY_PHASES)
    assert any("the rank compiled for itself beside the gate" in n for n in new["run"]["notes"])
    assert losses(tmp_path / "out-new") == losses(tmp_path / "out-old")  # bit for bit
    # the same warm-up record as the child's (one key, this config), its files in the managed cache
    (record,) = warm_records(tmp_path / "home-new")
    assert [r["key"] for r in warm_records(tmp_path / "home-old")] == [record["key"]]
    assert any(path.startswith("inductor/") for path in record["files"])
    again, _ = launch(tmp_path / "out-again", tmp_path / "home-new")
    skipped = [n for n in again["run"]["notes"] if n.startswith("compile cache: ")]
    assert "warm-up skipped" in skipped[0], skipped
    assert losses(tmp_path / "out-again") == losses(tmp_path / "out-old")
    assert warm_records(tmp_path / "home-new") == [record]  # kept, not rewritten


def start_late(tmp_path: Path, mode: str, **env: str) -> subprocess.Popen[str]:
    """`train` with the late check above, in a session of its own (the test kills it whole if it must)."""
    return subprocess.Popen(
        [sys.executable, "-c", LATE_DRIVER, *train_args(tmp_path / "out", **{"optim.steps": "3"})],
        cwd=REPO,
        env=environ(tmp_path / "home", LATE_MODE=mode, LATE_SIGNAL=str(tmp_path / "rank.pid"), **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


LOCK_FILES = {
    ".dflash-run.lock",
    ".dflash-run.owner.json",
}  # the owner's note stays when its holder is killed


def no_output(out: Path) -> None:
    """Nothing of a run in `out`: no metrics, summary, checkpoint or export, at most the folder's lock."""
    assert not out.exists() or not {p.name for p in out.iterdir()} - LOCK_FILES, list(out.iterdir())


@pytest.mark.slow  # a real rank that compiles, then is stopped: ~40 s on a busy 2-core box
def test_a_check_failing_after_the_rank_compiled_refuses_and_leaves_nothing(tmp_path: Path) -> None:
    proc = start_late(tmp_path, "fail")
    try:
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 1, stdout[-2000:] + stderr[-2000:]
    assert "launch refused" in stdout and "ownership.clobbered" in stdout
    pid = int((tmp_path / "rank.pid").read_text())  # the rank had compiled and was waiting for its go
    assert gone(pid, within_s=1.0)  # stopped before the launcher returned
    assert not (tmp_path / "out").exists()  # the early lock made the folder; the refusal removed it
    assert warm_records(tmp_path / "home") == []
    records = RunStore(tmp_path / "home" / "state" / "runs").all()
    assert [r.status for r in records] == ["refused"]
    assert sorted(p.name for p in (tmp_path / "home" / "state" / "runs" / records[0].id).iterdir()) == [
        "record.json"
    ]


@pytest.mark.slow  # a real rank whose compile fails (no C++ compiler): ~30 s on a busy 2-core box
def test_a_rank_whose_compile_fails_is_a_clear_warm_up_error_and_no_record(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "dflash_doctor", *train_args(tmp_path / "out", **{"optim.steps": "3"})]
    done = subprocess.run(
        command,
        cwd=REPO,
        env=environ(tmp_path / "home", CXX="/nonexistent/g++"),  # Inductor's CPU kernels cannot be built
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    err = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]  # as a failed warm-up child
    assert "error: warm-up failed in the rank, which compiles for itself (exit 1): InductorError:" in err
    assert "No working C++ compiler" in err and "Traceback" not in done.stdout + done.stderr
    assert warm_records(tmp_path / "home") == []
    no_output(tmp_path / "out")
    (record,) = RunStore(tmp_path / "home" / "state" / "runs").all()
    assert record.status == "failed" and any("warm-up failed in the rank" in n for n in record.notes)
    log = (tmp_path / "home" / "state" / "runs" / record.id / "stop.log").read_text()
    assert "InvalidCxxCompiler" in log  # the rank's own traceback, kept for a post-mortem


@pytest.mark.slow  # a real rank that compiles, its launcher then killed: ~40 s on a busy 2-core box
def test_a_rank_waiting_for_its_go_stops_when_the_launcher_is_killed(tmp_path: Path) -> None:
    proc = start_late(tmp_path, "hang")
    try:
        deadline = time.monotonic() + 400
        signal_file = tmp_path / "rank.pid"
        while not (signal_file.is_file() and signal_file.read_text()) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        pid = int(signal_file.read_text())
        rank = psutil.Process(pid)
        family = [rank, *rank.children(recursive=True)]  # its compile workers too
        proc.kill()  # the launcher alone (the rank runs in a session of its own): no signal reaches the rank
        proc.communicate()
        assert all(gone(p.pid, within_s=10.0) for p in family), [p.pid for p in family if p.is_running()]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    no_output(tmp_path / "out")
    assert warm_records(tmp_path / "home") == []
