"""What `regenerate` checks of its input before generating: a prompt longer than the context is left out with
`--on-error skip`, and an --out that is the --prompts file (by any path) is refused, forced or not (issue 29)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainer.regenerate.job import RegenerateError, regenerate, scan_input


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def target_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3 target with a 512-word tokenizer and a chat template; context 4096."""
    from bench.lib.target_folder import make_target_folder

    return make_target_folder(tmp_path_factory.mktemp("target"))


def test_with_on_error_skip_a_too_long_prompt_is_left_out(target_folder: Path, tmp_path: Path) -> None:
    from trainer.regenerate.job import check_prompt_lengths
    from trainer.regenerate.settings import GenerationSettings

    prompts = tmp_path / "in.jsonl"
    long_chat = {"messages": [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2"}]}
    long_chat["messages"].append({"role": "user", "content": " ".join(["w5"] * 4200)})  # a later turn
    prompts.write_text('{"prompt": "w1 w2"}\n' + json.dumps(long_chat) + "\n")
    scan = check_prompt_lengths(scan_input(prompts, "skip"), GenerationSettings(str(target_folder)), "skip")
    assert [r.line for r in scan.records] == [1] and [b.line for b in scan.bad] == [2]


@pytest.mark.parametrize("name", ["same", "dotdot", "symlink", "hardlink", "same-forced"])
def test_out_that_is_the_prompts_file_is_refused_forced_or_not(tmp_path: Path, name: str) -> None:
    """Was: "made with other settings" (or "damaged"); with --force the prompts were moved aside."""
    from tests.trainer.regenerate.test_regenerate import SETTINGS, EchoEngine

    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"prompt": "w1"}\n')
    before = prompts.read_bytes()
    out = {
        "same": prompts,
        "same-forced": prompts,
        "dotdot": tmp_path / "sub" / ".." / "in.jsonl",
        "symlink": tmp_path / "link.jsonl",
        "hardlink": tmp_path / "hard.jsonl",
    }[name]
    (tmp_path / "sub").mkdir()
    if name == "symlink":
        out.symlink_to(prompts)
    if name == "hardlink":
        os.link(prompts, out)
    with pytest.raises(RegenerateError, match="is the --prompts file"):
        regenerate(scan_input(prompts, "stop"), out, SETTINGS, EchoEngine, force=name == "same-forced")
    assert prompts.read_bytes() == before and sorted(p.name for p in tmp_path.glob("in.jsonl*")) == [
        "in.jsonl"
    ]
