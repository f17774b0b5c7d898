"""The training progress explains itself: a legend for "accept" before the first step's line, and nothing
printed before training starts (issue 18)."""

from __future__ import annotations

import io

from trainer.run.metrics import LEGEND, Progress, StepMetrics


def step(n: int) -> StepMetrics:
    return StepMetrics(
        step=n, loss=2.0, lr=1e-3, grad_norm=1.0, accuracy=[0.5], accept_len=1.58,
        accept_len_from_accuracy=1.5, tok_s=100.0, supervised_tok_s=50.0, samples_s=1.0, step_time_s=0.1, data_wait_s=0.0,
    )  # fmt: skip


def test_progress_explains_accept_and_prints_nothing_before_the_first_step() -> None:
    out = io.StringIO()
    progress = Progress(total_steps=10, start_step=0, log_every=5, stream=out)
    assert out.getvalue() == ""  # other ranks' "ready" lines are not drawn over before training starts
    progress.update(step(1))
    lines = out.getvalue().splitlines()
    assert lines[0] == LEGEND and "acceptance length" in LEGEND
    assert "accept 1.58" in lines[1]
