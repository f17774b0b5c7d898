"""`runs show` keeps NaN or infinite losses in sight: how many steps, from which step (issue 29)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_doctor.cli import run


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize("diverged_at", [3, 1])
def test_runs_show_keeps_a_nan_loss_in_sight(tmp_path: Path, diverged_at: int, capsys) -> None:
    """Was: the loss curve dropped its NaN steps (or vanished when every step was NaN) without a word."""
    from dflash_doctor.launch.runs import RunStore

    rows = [
        {"step": s, "loss": float("nan") if s >= diverged_at else 5.0 - s, "tok_s": 100.0}
        for s in range(1, 8)
    ]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    record = RunStore().create("failed", output_dir=str(tmp_path / "out"))
    assert run(["runs", "show", record.id]) == 0
    out = " ".join(capsys.readouterr().out.split())
    nan_steps = 8 - diverged_at
    assert f"loss is NaN or infinite at {nan_steps} of 7 steps, first at step {diverged_at}" in out
    assert "-> NaN" in out if diverged_at > 1 else "NaN or infinite at every step" in out
