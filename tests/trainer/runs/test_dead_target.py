"""A target rank that dies makes the whole job exit non-zero, quickly, saying what happened."""

from __future__ import annotations

from pathlib import Path

from tests.trainer.trainer_runs import torchrun

BOUND_S = 120  # start-up included; the failure itself is noticed within seconds


def test_dead_target_stops_the_job(tmp_path: Path) -> None:
    run = torchrun(
        "configs/tiny-cpu.toml",
        tmp_path / "out",
        nproc=2,
        fault="target_exit_at_batch:5",
        timeout=BOUND_S + 60,
    )
    assert run.returncode != 0
    assert run.seconds < BOUND_S
    assert "target rank 0 exiting at batch 5" in run.stderr
    assert "trainer FAILED" in run.stderr or "ChildFailedError" in run.stderr  # torchrun's own verdict
    metrics = run.metrics
    assert len(metrics) <= 5  # the drafter never trained past the last batch it received
    summary_file = run.out_dir / "summary.json"
    if summary_file.is_file():  # absent only when the drafter was stopped before its loop began
        # Two true endings race: the drafter notices the dead peer itself ("failed"), or torchrun, having
        # seen the target exit, stops it with SIGTERM first ("interrupted"). Never "ok", never silent.
        assert run.summary["status"] in {"failed", "interrupted"}, run.summary
        assert run.summary["error"]
        if run.summary["status"] == "interrupted":
            assert "Stopped" in run.summary["error"], run.summary["error"]
