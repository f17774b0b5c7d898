"""Resume: kill -9 mid-run, start again; the next 20 steps' losses equal an uninterrupted run's."""

from __future__ import annotations

from pathlib import Path

from tests.trainer.trainer_runs import reference_run, run_until_then_kill9, torchrun


def test_kill9_then_resume_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run_until_then_kill9("configs/tiny-cpu.toml", out, nproc=2, hang_after_step=27)  # checkpoint at 20
    assert [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step_")] == [
        "step_00000020"
    ]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 27

    resumed = torchrun("configs/tiny-cpu.toml", out, nproc=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming at step 20" in resumed.stdout
    reference = reference_run()
    assert reference.returncode == 0, reference.stderr[-3000:]

    after = {m["step"]: m["loss"] for m in resumed.metrics}
    expected = {m["step"]: m["loss"] for m in reference.metrics}
    assert sorted(after) == list(range(1, 41))  # steps 21-27 of the killed attempt were dropped, not doubled
    assert [after[s] for s in range(21, 41)] == [expected[s] for s in range(21, 41)]  # bit for bit
    assert resumed.summary["status"] == "ok" and resumed.summary["resumed_from"] == 20
