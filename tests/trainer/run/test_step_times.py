"""Every step's time is the time that step took: its own capture and training, never the next step's capture.

A colocated rank queues the next step's first capture behind each update. Timed from one step's end to the
next, the window of step N used to hold step N+1's capture: the last step and every step before a held-out
evaluation or a checkpoint (which queue none) came out short (147.9 ms against 214 ms at qwen3-8b-b16 on an
H200), and the run's tok/s was a mean of per-step rates, 8% above the truth at seed-b32. Here each capture
is slowed by a known delay (DFLASH_FAULT=capture_delay_ms), so every real step takes at least that long.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.trainer_runs import SHORT, torchrun
from trainer.run.metrics import steady_throughput, summarize

DELAY_S = 1.5  # far above a tiny step's own time, even on a loaded 2-core box


def test_every_step_window_holds_its_own_capture_and_the_summary_is_tokens_over_seconds(
    tmp_path: Path,
) -> None:
    overrides = {
        **SHORT,
        "topology.mode": '"colocated"',
        "optim.steps": "8",
        "data.eval_fraction": "0.125",
        "eval.every": "3",  # evaluations after steps 3, 6 and 8: steps 3 and 6 queue no capture ahead
        "checkpoint.every": "0",
    }
    run = torchrun("configs/tiny-cpu.toml", tmp_path / "out", nproc=1, overrides=overrides,
                   fault=f"capture_delay_ms:{int(DELAY_S * 1000)}")  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    times = {m["step"]: m["step_time_s"] for m in run.metrics}
    assert sorted(times) == list(range(1, 9))
    short = {step: t for step, t in times.items() if t < DELAY_S}
    assert not short, f"steps timed without their own capture (each takes >= {DELAY_S} s): {short}"
    for m in run.metrics:  # a step's rate is its own tokens over its own time
        assert m["tok_s"] == pytest.approx(m["tokens"] / m["step_time_s"])
    summary = run.summary
    steady = [m for m in run.metrics if m["step"] >= 2]  # 8 steps: fewer than ten, only step 1 is warm-up
    assert summary["steady_steps"] == [2, 8]
    expected = sum(m["tokens"] for m in steady) / sum(m["step_time_s"] for m in steady)
    assert summary["steady_tok_s"] == pytest.approx(expected)
    assert "mean_tok_s" not in summary


def test_throughput_is_total_tokens_over_total_time_not_a_mean_of_rates() -> None:
    """Two equal-token steps, one fast and one slow: the mean of their rates says 1.25x what ran."""
    lines = [{"step": 1, "tokens": 100.0, "step_time_s": 9.0, "tok_s": 100 / 9.0}]  # warm-up, not counted
    lines += [
        {"step": s, "tokens": 100.0, "step_time_s": t, "tok_s": 100 / t} for s, t in ((2, 0.5), (3, 1.0))
    ]
    steady = steady_throughput(lines)
    assert steady["steady_tok_s"] == pytest.approx(200 / 1.5)  # 133.3, where the mean of rates is 150
    assert steady["steady_steps"] == [2, 3]
    many = [{"step": s, "tokens": 10.0, "step_time_s": 1.0, "tok_s": 10.0} for s in range(1, 21)]
    assert summarize(many, "ok", 20.0)["steady_steps"] == [6, 20]  # the first five steps are warm-up
