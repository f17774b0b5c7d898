"""`eval --prompts` is checked before the target loads: a lone surrogate names its line (issue 29)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_base.errors import ConfigError
from tests.trainer.input_files import LONE


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_lone_surrogate_in_eval_prompts_is_a_named_line(tmp_path: Path) -> None:
    from trainer.runspec.eval_request import check_eval_prompts

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": ' + LONE + "}\n")
    with pytest.raises(ConfigError, match=r"line 1: prompt holds a lone surrogate"):
        check_eval_prompts(str(prompts), 512)
