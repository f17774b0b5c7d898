"""Real trainer runs under torchrun (gloo, CPU) shared by the end-to-end tests: each start costs seconds."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

# tiny-cpu, shortened: 40 steps over 64 short sequences, a checkpoint every 20 steps
SHORT = {
    "data.seq_len": "64",
    "data.num_samples": "64",
    "optim.batch_size": "4",
    "optim.anchors": "16",
    "optim.steps": "40",
    "checkpoint.every": "20",
    "checkpoint.keep": "3",
    "run.log_every": "10",
    "run.timeout_s": "180",  # a busy 2-core box took 65 s to warm up the drafter while the target waited
}


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    out_dir: Path
    seconds: float

    @property
    def metrics(self) -> list[dict[str, Any]]:
        path = self.out_dir / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []

    @property
    def summary(self) -> dict[str, Any]:
        return json.loads((self.out_dir / "summary.json").read_text())


def command(config: str, out_dir: Path, nproc: int, overrides: dict[str, str] | None = None) -> list[str]:
    sets = {**SHORT, **(overrides or {}), "output.dir": json.dumps(str(out_dir))}
    args = [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "--max-restarts=0", "-m", "trainer", "--config", config, *args,
    ]  # fmt: skip


def environment(fault: str | None = None) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "DFLASH_FAULT")
    }
    if fault:
        env["DFLASH_FAULT"] = fault
    return env


def torchrun(
    config: str, out_dir: Path, nproc: int, overrides: dict[str, str] | None = None,
    fault: str | None = None, timeout: float = 300,
) -> Run:  # fmt: skip
    began = time.monotonic()
    proc = subprocess.run(
        command(config, out_dir, nproc, overrides), cwd=REPO, env=environment(fault),
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    return Run(proc.returncode, proc.stdout, proc.stderr, out_dir, time.monotonic() - began)


def run_until_then_kill9(
    config: str, out_dir: Path, nproc: int, hang_after_step: int, timeout: float = 300
) -> None:
    """Start a run whose first drafter stops after `hang_after_step` steps, wait for that step's metrics
    line, then SIGKILL torchrun and every worker at once (a machine that died mid-run)."""
    proc = subprocess.Popen(
        command(config, out_dir, nproc), cwd=REPO, env=environment(f"drafter_hang_at_step:{hang_after_step}"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            path = out_dir / "metrics.jsonl"
            lines = path.read_text().splitlines() if path.is_file() else []
            if len(lines) >= hang_after_step:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the run never reached step {hang_after_step} (exit {proc.poll()})")
    finally:
        # torchrun starts each worker in a session of its own: killing torchrun's group misses them, so
        # every process of the tree is found first and killed with it (issue 18, row 17).
        import psutil

        try:
            workers = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            workers = []
        os.killpg(proc.pid, signal.SIGKILL)
        for worker in workers:
            with contextlib.suppress(psutil.Error):
                worker.kill()
        proc.wait()
        psutil.wait_procs(workers, timeout=30)


@functools.cache
def reference_run() -> Run:
    """tiny-cpu (1 target + 1 drafter), shortened, uninterrupted: shared by the loss and resume tests."""
    out = Path(tempfile.mkdtemp(prefix="dflash-reference-"))
    return torchrun("configs/tiny-cpu.toml", out, nproc=2)
