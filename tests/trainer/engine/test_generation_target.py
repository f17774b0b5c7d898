"""`data regenerate` loads the target as training does: one tokenizer loader, and `target.dtype` honoured
(it was ignored: the generation target was always loaded in the device's default dtype)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bench.lib.target_folder import make_target_folder
from trainer.engine.target import load_generation_target
from trainer.regenerate.job import prepare_regeneration
from trainer.regenerate.settings import GenerationSettings
from trainer.runspec.regenerate_request import RegenerateRequest


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_target_folder(tmp_path_factory.mktemp("target"))


@pytest.mark.parametrize(("dtype", "loaded"), [("auto", torch.float32), ("bf16", torch.bfloat16)])
def test_the_generation_target_takes_the_dtype_asked_for(
    target: Path, dtype: str, loaded: torch.dtype
) -> None:
    model, tokenizer = load_generation_target(str(target), torch.device("cpu"), dtype)
    assert next(model.parameters()).dtype == loaded
    assert tokenizer.chat_template is not None


def test_regenerate_settings_carry_target_dtype(target: Path, tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text(
        f'[target]\npath = "{target}"\n[data]\nkind = "chat"\npath = "x.jsonl"\n[optim]\nsteps = 1\n'
    )
    prompts = tmp_path / "in.jsonl"
    prompts.write_text(json.dumps({"prompt": "w1"}) + "\n")
    base = RegenerateRequest(config=str(config), prompts=prompts, out=tmp_path / "out.jsonl")
    default, _ = prepare_regeneration(base)
    assert default.dtype == "auto" and "dtype" not in default.to_json()  # outputs written before still resume
    bf16, _ = prepare_regeneration(replace(base, overrides=("target.dtype=bf16",)))
    assert bf16.dtype == "bf16" and bf16.to_json()["dtype"] == "bf16"  # recorded: a resume in fp32 is refused


def test_settings_without_dtype_match_lines_written_before_it_was_recorded() -> None:
    old_line_settings = {
        "target": "/t", "max_new_tokens": 8, "temperature": 0.0, "top_p": 1.0, "chat_template_kwargs": {}, "seed": 0,
    }  # fmt: skip
    assert GenerationSettings("/t", max_new_tokens=8).to_json() == old_line_settings


def test_an_output_made_in_another_dtype_is_refused_on_resume(tmp_path: Path) -> None:
    from trainer.regenerate.job import RegenerateError, resume_state

    out = tmp_path / "out.jsonl"
    bf16 = GenerationSettings("/t", max_new_tokens=8, dtype="bf16")
    line = {
        "id": "a",
        "prompt_id": "a",
        "sample": 0,
        "messages": [],
        "generation": bf16.to_json(),
        "schema": 1,
    }
    out.write_text(json.dumps(line) + "\n")
    assert resume_state(out, bf16, force=False) == {"a"}
    with pytest.raises(RegenerateError, match="made with other settings"):
        resume_state(out, GenerationSettings("/t", max_new_tokens=8), force=False)
