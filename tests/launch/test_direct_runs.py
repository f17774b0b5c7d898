"""The real chain for one process: `train` -> `python -m trainer` (no torchrun) on CPU, tiny-cpu colocated on
one rank. It succeeds with its record, timeline and snapshot; a stop signal ends it with nothing left and the
record `interrupted`; a failing rank is recorded `failed` with why. Slow: each launch imports torch and
builds the models (tests/launch/test_direct_launch.py covers the launcher's side fast)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dflash_doctor.launch.runs import RunStore
from dflash_doctor.launch.supervise import ProcessTree
from dflash_doctor.launch.timeline import BESIDE_THE_RANK, EARLY_PHASES
from tests.launch.test_interrupts import REAL_DRIVER, stop_once_trained

REPO = Path(__file__).resolve().parents[2]
# tiny-cpu on one colocated rank, very short; nothing for the CPU warm-up to compile but the layers
SHORT = {
    "topology.mode": '"colocated"',
    "data.seq_len": "64",
    "data.num_samples": "32",
    "optim.batch_size": "2",
    "optim.anchors": "8",
    "checkpoint.every": "0",
    "run.log_every": "1",
}


def train_args(out: Path, **sets: str) -> list[str]:
    items = {**SHORT, **sets, "output.dir": json.dumps(str(out))}
    return [
        "train",
        "--config",
        "tiny-cpu",
        "--no-deep",
        *(a for k, v in items.items() for a in ("--set", f"{k}={v}")),
    ]


def environ(home: Path, **extra: str) -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DFLASH_FAULT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "DFLASH_DOCTOR_HOME": str(home), "PYTHONPATH": str(REPO), **extra}


class Watch:
    """The launcher's process tree and every member's command line, read while they live."""

    def __init__(self, pid: int) -> None:
        self.tree = ProcessTree(pid)
        self.commands: dict[int, str] = {}

    def refresh(self) -> None:
        self.tree.refresh()
        for pid, process in self.tree.known.items():
            if pid not in self.commands:
                with contextlib.suppress(psutil.Error):
                    self.commands[pid] = " ".join(process.cmdline())

    def ran(self, text: str) -> bool:
        return any(text in command for command in self.commands.values())


@pytest.mark.slow  # a real launch, the rank its own warm-up: ~45 s on a busy 2-core box
def test_a_one_process_launch_runs_the_trainer_directly_and_records_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, home = tmp_path / "out", tmp_path / "home"
    command = [sys.executable, "-m", "dflash_doctor", *train_args(out, **{"optim.steps": "3"}), "--json"]
    proc = subprocess.Popen(
        command, cwd=REPO, env=environ(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    watch = Watch(proc.pid)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            watch.refresh()
            time.sleep(0.2)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        watch.tree.kill_all()
    assert proc.returncode == 0, stderr[-3000:]
    run = json.loads(stdout)["run"]
    assert run["status"] == "succeeded" and run["exit_code"] == 0
    assert run["command"][1:3] == ["-m", "trainer"] and run["plan"]["launcher"] == "direct"
    assert watch.ran(" -m trainer --config "), watch.commands
    assert not watch.ran("torch.distributed.run"), watch.commands  # no torchrun in between
    phases = [row["phase"] for row in run["timeline"]["phases"]]
    assert phases == list(EARLY_PHASES)  # the rank started beside the gate: it is on the path (lone_rank.py)
    assert [row["phase"] for row in run["timeline"]["beside"]] == list(BESIDE_THE_RANK)
    assert run["timeline"]["first_step_s"] > 0
    assert run["metrics"]["steps"] == 3
    assert run["snapshot"] and "snapshot" in run["snapshot"]  # the compile cache kept after the success
    assert (out / "export" / "config.json").is_file()
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(home))
    (record,) = RunStore().all()
    assert record.status == "succeeded" and record.timeline == run["timeline"] and record.tokens_per_second


def start_stubbed(tmp_path: Path, fault: str | None = None, **sets: str) -> subprocess.Popen[str]:
    """`train` with its compile-cache warm-up stubbed (tests/cache covers it): the rank compiles for itself."""
    extra = {"DFLASH_FAULT": fault} if fault else {}
    return subprocess.Popen(
        [sys.executable, "-c", REAL_DRIVER, *train_args(tmp_path / "out", **sets)],
        env=environ(tmp_path / "home", **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.slow  # a real rank, stopped once it has trained: ~30 s each on a busy 2-core box
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_a_direct_rank_with_nothing_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: signal.Signals
) -> None:
    proc = start_stubbed(tmp_path, **{"optim.steps": "100000"})
    watch = Watch(proc.pid)
    tree = watch.tree
    try:  # the signal to the launcher alone: the rank is in a session of its own
        stdout, stderr = stop_once_trained(proc, watch.refresh, tmp_path / "out" / "metrics.jsonl", 2, signum)
    finally:
        left = [p.pid for p in tree.alive()]
        tree.kill_all()
    assert proc.returncode == 128 + signum, stdout[-2000:] + stderr[-2000:]
    assert left == [], f"left running: {left}"
    assert watch.ran(" -m trainer --config ") and not watch.ran("torch.distributed.run"), watch.commands
    assert f"stopping the run ({signum.name}): signalled the rank" in stdout
    assert "Traceback" not in stdout + stderr
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    (record,) = RunStore().all()
    assert record.status == "interrupted" and record.exit_code == 128 + signum
    assert record.metrics.get("last_step", {}).get("step", 0) >= 2 or record.metrics.get("steps", 0) >= 2
    assert not (tmp_path / "out" / ".dflash-run.owner.json").exists()  # the output folder was released


@pytest.mark.slow  # a real rank that fails once its models are built: ~20 s on a busy 2-core box
def test_a_failing_direct_rank_is_recorded_failed_with_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rank fails on its own (a malformed testing hook: a ValueError when the target side is built); with
    no torchrun to summarise it, its exit code and its traceback's tail are the record's."""
    proc = start_stubbed(tmp_path, fault="not_a_fault:1", **{"optim.steps": "3"})
    try:
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, stdout[-2000:] + stderr[-2000:]
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    (record,) = RunStore().all()
    assert record.command[1:3] == ["-m", "trainer"]
    assert record.status == "failed" and record.exit_code == 1
    assert any("DFLASH_FAULT='not_a_fault:1'" in line for line in record.stderr_tail), record.stderr_tail
    assert not (tmp_path / "out" / ".dflash-run.owner.json").exists()
