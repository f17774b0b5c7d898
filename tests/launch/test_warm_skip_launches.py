"""Real `dflash-doctor train` launches on CPU (a real warm-up child that compiles, real torchrun): the
second launch of a config skips the warm-up child, also after a run that was interrupted (issue 17)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "data.seq_len=64", "data.num_samples=32", "optim.batch_size=2", "optim.anchors=8", "run.log_every=1",
    "checkpoint.every=0",
]  # fmt: skip


def launch_command(out: Path, steps: int) -> list[str]:
    sets = [*TINY, f"optim.steps={steps}", f"output.dir={json.dumps(str(out))}"]
    return [sys.executable, "-m", "dflash_doctor", "train", "--config", "tiny-cpu", "--no-deep"] + [
        arg for item in sets for arg in ("--set", item)
    ]


def environment(home: Path) -> dict[str, str]:
    return {**os.environ, "DFLASH_DOCTOR_HOME": str(home), "COLUMNS": "250"}


def stop_group(proc: subprocess.Popen[str], how: int) -> None:
    """Signal the launcher's whole process group (as a terminal or a scheduler would), then reap it;
    whatever is still alive after the grace period is killed, so the test leaves nothing behind."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, how)
    try:
        proc.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def compile_cache_line(output: str) -> str:
    """The launcher's verdict on the cache (the last `compile cache:` line; the first says it is warming)."""
    lines = [line for line in output.splitlines() if line.startswith("compile cache:")]
    return lines[-1] if lines else ""


@pytest.mark.slow  # three real launches: ~1 min of CPU, ~3 min on a busy 2-core box
def test_a_second_launch_skips_the_warm_up_also_after_an_interrupted_run(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = subprocess.run(
        launch_command(tmp_path / "out1", steps=2), cwd=REPO, env=environment(home),
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "warm-up on cpu: 1 graphs compiled" in compile_cache_line(first.stdout)  # compiled for real

    # Other steps and output; SIGTERM to the launcher's group right after the export, as in the issue.
    out2 = tmp_path / "out2"
    log = tmp_path / "second.log"
    with open(log, "w") as sink:
        proc = subprocess.Popen(
            launch_command(out2, steps=3), cwd=REPO, env=environment(home), stdout=sink,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 600
            while not (out2 / "export").is_dir() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            stop_group(proc, signal.SIGTERM)
    second = log.read_text()
    assert "warm-up skipped" in compile_cache_line(second), second[-3000:]

    third = subprocess.run(
        launch_command(tmp_path / "out3", steps=4), cwd=REPO, env=environment(home),
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert "warm-up skipped" in compile_cache_line(third.stdout), third.stdout[-3000:]
    assert "succeeded" in third.stdout


def worker_misses(out: Path) -> int:
    """fxgraph cache misses in the drafter worker's own warm-up: graphs it compiled itself."""
    return int(json.loads((out / "summary.json").read_text())["warmup"]["fxgraph_cache_miss"])


@pytest.mark.slow  # two real launches, one cold: ~2 min of CPU, ~4 on a busy 2-core box
def test_the_worker_compiles_nothing_the_warm_up_compiled_and_the_time_said_includes_it(
    tmp_path: Path,
) -> None:
    """Issue 39 U4: tiny-cpu is 1+1, so torchrun gave each worker OMP_NUM_THREADS=1 while the warm-up child
    ran at the machine's thread count: Inductor's C++ for another thread count is another graph, and the
    worker compiled it again (94 s). A launch that changes only `optim.lr` and `eval.every` ran both again."""
    home = tmp_path / "home"
    first = subprocess.run(
        launch_command(tmp_path / "out1", steps=2), cwd=REPO, env=environment(home),
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "warm-up on cpu: 1 graphs compiled" in compile_cache_line(first.stdout)
    assert worker_misses(tmp_path / "out1") == 0, "the worker compiled a graph the warm-up had compiled"
    before = float(first.stdout.split("before torchrun: ", 1)[1].split(" s", 1)[0])
    took = float(first.stdout.split("succeeded in ", 1)[1].split(" s", 1)[0])
    assert took >= before  # the time said counts the gate and the warm-up, not only torchrun

    sets = ["--set", "optim.lr=1e-3", "--set", "eval.every=1"]
    second = subprocess.run(
        launch_command(tmp_path / "out2", steps=2) + sets, cwd=REPO, env=environment(home),
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "warm-up skipped" in compile_cache_line(second.stdout), second.stdout[-3000:]
    assert worker_misses(tmp_path / "out2") == 0
