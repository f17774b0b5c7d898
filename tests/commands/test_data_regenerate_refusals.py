"""`data regenerate` refuses bad prompts (a lone surrogate, a prompt longer than the context) before the target
loads, with nothing written, and needs no drafter setting (issue 29)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_base.errors import ConfigError
from dflash_doctor.cli import run
from tests.trainer.input_files import LONE, no_target_loads, run_config
from trainer.runspec.config import load_config


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def target_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3 target with a 512-word tokenizer and a chat template; context 4096."""
    from bench.lib.target_folder import make_target_folder

    return make_target_folder(tmp_path_factory.mktemp("target"))


def test_a_lone_surrogate_in_prompts_is_a_named_line_and_nothing_is_written(
    target_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: `data regenerate` exit 3 (the tokenizer's TypeError) with a 0-byte --out."""
    no_target_loads(monkeypatch)
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "w1"}\n{"prompt": ' + LONE + "}\n")
    out = tmp_path / "out.jsonl"
    config = run_config(tmp_path, target_folder, tmp_path / "x.jsonl")
    argv = ["data", "regenerate", "--config", str(config), "--prompts", str(prompts), "--out", str(out)]
    assert run([*argv, "--engine", "torch"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "line 2: \"prompt\" holds a lone surrogate ('\\ud800') at character 3" in err
    assert not out.exists()


def test_a_prompt_longer_than_the_context_is_refused_before_the_target_loads(
    target_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: exit 3 after 75 s (an allocation failure at 3.5M tokens), a 0-byte --out."""
    no_target_loads(monkeypatch)
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "w1 w2"}\n' + json.dumps({"prompt": " ".join(["w5"] * 5000)}) + "\n")
    out = tmp_path / "out.jsonl"
    config = run_config(tmp_path, target_folder, tmp_path / "x.jsonl")
    argv = ["data", "regenerate", "--config", str(config), "--prompts", str(prompts), "--out", str(out)]
    assert run([*argv, "--engine", "torch"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "line 2: 5,00" in err and "tokens, longer than the target's context (4,096 tokens)" in err
    assert not out.exists()


def test_regenerate_with_a_target_that_has_no_mask_token(
    target_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Was: it asked for drafter.mask_token_id, a drafter setting generation never uses."""
    from dflash_doctor.commands import data as data_command
    from tests.trainer.regenerate.test_regenerate import EchoEngine

    config = run_config(tmp_path, target_folder, tmp_path / "x.jsonl", mask=False)
    with pytest.raises(ConfigError, match=r"drafter\.mask_token_id: no default"):
        load_config(config, check_data=False)  # training still needs one: every embedding row is a token
    monkeypatch.setattr(data_command, "_engine_factory", lambda *a: EchoEngine)
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "w1"}\n')
    argv = [
        "data",
        "regenerate",
        "--config",
        str(config),
        "--prompts",
        str(prompts),
        "--out",
        str(tmp_path / "o"),
    ]
    assert run(argv) == 0, capsys.readouterr().err
