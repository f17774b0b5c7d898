"""A config whose one step needs more sequences than the training split holds is refused (issue 29)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_base.errors import ConfigError
from trainer.runspec.config import load_config


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_step_bigger_than_the_training_split_is_refused() -> None:
    """Was: `optim.grad_accum=100000000` passed the dry run (800M sequences a step, 461 in the split)."""
    with pytest.raises(
        ConfigError, match=r"optim.grad_accum: one step is .* = 800,000,000 sequences .* the 461 "
    ):
        load_config("tiny-cpu", ["optim.grad_accum=100000000"])
    load_config("tiny-cpu", ["optim.grad_accum=57"])  # 456 of 461: big, but a step
