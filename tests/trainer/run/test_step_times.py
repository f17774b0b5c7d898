"""Every step's time is the time that step took: its own capture and training, never the next step's capture.

A colocated rank queues the next step's first capture behind each update. Timed from one step's end to the
next, the window of step N used to hold step N+1's capture: the last step and every step before a held-out
evaluation or a checkpoint (which queue none) came out short (147.9 ms against 214 ms at qwen3-8b-b16 on an
H200), and the run's tok/s was a mean of per-step rates, 8% above the truth at seed-b32. Here each capture
is slowed by a known delay (DFLASH_FAULT=capture_delay_ms), so every real step takes at least that long.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.trainer.trainer_runs import SHORT, torchrun
from trainer.run.metrics import steady_throughput, summarize
from trainer.run.steady import LEFT_OUT_BECAUSE, classify, steady_window, window_kind

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
    windows = {m["step"]: m["window"] for m in run.metrics}
    assert windows == {
        1: "first", 2: "pipelined", 3: "evaluation", 4: "after a pause",
        5: "pipelined", 6: "evaluation", 7: "after a pause", 8: "last",
    }  # fmt: skip
    summary = run.summary
    steady = [m for m in run.metrics if m["step"] in (2, 5)]  # the whole pipelined steps only
    assert summary["steady_used"] == "2, 5" and summary["steady_step_count"] == 2
    assert summary["steady_left_out"] == {
        "warm-up": "1", "last": "8", "evaluation": "3, 6", "after a pause": "4, 7",
    }  # fmt: skip
    expected = sum(m["tokens"] for m in steady) / sum(m["step_time_s"] for m in steady)
    assert summary["steady_tok_s"] == pytest.approx(expected)
    assert "mean_tok_s" not in summary
    assert summary["median_tok_s"] > 0 and summary["step_drift"] is None  # 2 steady steps: nothing to compare
    assert all(m["machine"]["proc_cpu_s"] >= 0 for m in run.metrics)  # the host's reading on every line


def test_throughput_is_total_tokens_over_total_time_not_a_mean_of_rates() -> None:
    """Two equal-token steps, one fast and one slow: the mean of their rates says 1.25x what ran."""
    lines = [{"step": 1, "tokens": 100.0, "step_time_s": 9.0, "tok_s": 100 / 9.0}]  # warm-up, not counted
    lines += [
        {"step": s, "tokens": 100.0, "step_time_s": t, "tok_s": 100 / t} for s, t in ((2, 0.5), (3, 1.0))
    ]
    lines += [{"step": 4, "tokens": 100.0, "step_time_s": 0.1, "tok_s": 1000.0}]  # the last: left out
    steady = steady_throughput(lines)
    assert steady["steady_tok_s"] == pytest.approx(200 / 1.5)  # 133.3, where the mean of rates is 150
    assert steady["steady_steps"] == [2, 3]
    many = [{"step": s, "tokens": 10.0, "step_time_s": 1.0, "tok_s": 10.0} for s in range(1, 21)]
    summary = summarize(many, "ok", 20.0)
    assert summary["steady_steps"] == [6, 19]  # the first five steps are warm-up, the last never counts
    assert summary["steady_left_out"] == {"warm-up": "1-5", "last": "20"}


def cpu_run_lines() -> list[dict[str, Any]]:
    """The issue-40 CPU run as its metrics lines say it: tiny-cpu colocated, 40 steps of 111 ms, a held-out
    evaluation and a checkpoint after steps 20 and 40; the last step took 374 ms, 3.4x the others."""
    lines: list[dict[str, Any]] = []
    for step in range(1, 41):
        seconds = 0.374 if step == 40 else 0.111
        window = window_kind(step, 1, 40, step % 20 == 0, step % 20 == 0, step == 21)
        heldout = 1.5 if step % 20 == 0 else None
        lines.append({"step": step, "tokens": 256.0, "step_time_s": seconds, "tok_s": 256.0 / seconds,
                      "supervised_tok_s": 128.0 / seconds, "heldout_accept_len": heldout,
                      "heldout_accept_len_labels": heldout, "heldout_s": 0.5 if heldout else None,
                      "window": window})  # fmt: skip
    return lines


def test_the_summary_counts_whole_pipelined_steps_and_names_those_it_left_out() -> None:
    """Issue 40: `steady_steps` used to end at the last step, so the summary counted it (and the steps
    before an evaluation or a checkpoint, and the one after, whose windows are not whole pipelined steps)."""
    lines = cpu_run_lines()
    summary = summarize(lines, "ok", 10.0)
    used = [r for r in lines if 6 <= r["step"] <= 39 and r["step"] not in (20, 21)]
    assert summary["steady_tok_s"] == pytest.approx(
        sum(r["tokens"] for r in used) / sum(r["step_time_s"] for r in used)
    )
    assert summary["steady_tok_s"] == pytest.approx(256.0 / 0.111)
    assert summary["steady_used"] == "6-19, 22-39" and summary["steady_step_count"] == 32
    assert summary["steady_left_out"] == {
        "warm-up": "1-5", "last": "40", "evaluation": "20", "after a pause": "21",
    }  # fmt: skip
    assert set(summary["steady_left_out"]) <= set(LEFT_OUT_BECAUSE)  # every reason has its sentence


def test_lines_written_before_windows_were_recorded_are_read_by_the_same_rule() -> None:
    """bench/ keeps metrics.jsonl copies without `window`: the last line, the evaluated steps (they carry a
    held-out figure), the checkpointed ones when the interval is known, and the step after each are out."""
    lines = [{k: v for k, v in r.items() if k != "window"} for r in cpu_run_lines()]
    assert classify(lines, checkpoint_every=20) == classify(cpu_run_lines())
    assert steady_window(lines, checkpoint_every=20) == steady_window(cpu_run_lines())
    kinds = classify(lines)
    assert kinds[19] == "evaluation" and kinds[20] == "after a pause" and kinds[39] == "last"


def test_a_run_with_no_whole_pipelined_step_has_no_steady_figure() -> None:
    one = [{"step": 1, "tokens": 10.0, "step_time_s": 1.0, "tok_s": 10.0, "window": "last"}]
    summary = steady_window(one)
    assert summary["steady_tok_s"] is None and summary["steady_steps"] is None
    assert summary["steady_left_out"] == {"last": "1"}
