"""`dflash-doctor data preview`: the first records as the trainer sees them, supervised tokens exactly the
assistant turns, counts over the whole file, and bad data named by its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_doctor.cli import run
from tests.trainer.chat_fixtures import (
    QWEN3_LIKE,
    REASONING,
    byte_tokenizer,
    save_chat_target,
    supervised_text,
)


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target saved as a Hugging Face folder with a byte-level tokenizer and a Qwen3-like template."""
    return save_chat_target(tmp_path_factory.mktemp("target"))


def _config(tmp_path: Path, target: Path, records: list[str], seq_len: int = 96) -> Path:
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(line + "\n" for line in records))
    config = tmp_path / "run.toml"
    config.write_text(
        f'[target]\npath = "{target}"\n[drafter]\nblock_size = 4\ntarget_layer_ids = [1]\n'
        f'[data]\nkind = "chat"\npath = "{data}"\nseq_len = {seq_len}\n[optim]\nsteps = 1\n'
    )
    return config


def test_preview_supervises_exactly_the_assistant_turns(tmp_path: Path, chat_target: Path, capsys) -> None:
    two = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    config = _config(
        tmp_path, chat_target, [json.dumps({"messages": REASONING}), json.dumps({"messages": two})]
    )
    assert run(["data", "preview", "--config", str(config), "--samples", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (sample,) = report["samples"]
    assert sample["line"] == 1 and len(sample["input_ids"]) == 96 == len(sample["loss_mask"])
    tokenizer = byte_tokenizer(QWEN3_LIKE)
    runs = supervised_text(tokenizer, sample["input_ids"], [bool(m) for m in sample["loss_mask"]])
    assert runs == ["<think>\nR2\n</think>\n\nA2<|im_end|>"]  # A1's think block is dropped: context (Q1)
    counts = report["counts"]
    assert counts["sequences"] == 2 and counts["truncated_sequences"] == 0
    assert (counts["answers"], counts["answers_out_of_context"]) == (3, 1)  # A1 (Q1, issue 38)
    assert 0 < counts["supervised_share"] < 0.5
    assert run(["data", "preview", "--config", str(config), "--samples", "2"]) == 0
    out = capsys.readouterr().out
    assert "line 1:" in out and "line 2:" in out and "2 sequences (chat, seq_len 96)" in out


def test_preview_counts_truncation(tmp_path: Path, chat_target: Path, capsys) -> None:
    config = _config(tmp_path, chat_target, [json.dumps({"messages": REASONING})], seq_len=40)
    assert run(["data", "preview", "--config", str(config), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["counts"]["truncated_share"] == 1.0 and report["samples"][0]["truncated"]


def test_preview_names_a_bad_line(tmp_path: Path, chat_target: Path, capsys) -> None:
    config = _config(
        tmp_path, chat_target, [json.dumps({"messages": REASONING}), json.dumps({"messages": "hi"})]
    )
    assert run(["data", "preview", "--config", str(config)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "chat.jsonl line 2: messages must be a non-empty list" in err  # load_config checks every line
