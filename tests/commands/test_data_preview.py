"""`data preview`'s text: the supervised tokens marked in a way a pipe, a log and NO_COLOR keep (issue 39
U9), and a legend that says what is shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_doctor.cli import run
from dflash_doctor.commands.data import SUPERVISED_CLOSE, SUPERVISED_OPEN
from tests.trainer.chat_fixtures import QWEN3_LIKE, byte_tokenizer, save_chat_target, supervised_text


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_chat_target(tmp_path_factory.mktemp("target"))


def chat_config(
    tmp_path: Path, target: Path, data: Path, data_lines: str = "", optim_lines: str = ""
) -> Path:
    """A run config previewing `data` (chat, seq_len 96 unless `data_lines` says) with the tiny chat target."""
    config = tmp_path / "run.toml"
    seq_len = "" if "seq_len" in data_lines else "seq_len = 96\n"
    config.write_text(
        f'[target]\npath = "{target}"\n[drafter]\nblock_size = 4\ntarget_layer_ids = [1]\n'
        f'[data]\nkind = "chat"\npath = "{data}"\n{seq_len}{data_lines}[optim]\nsteps = 1\n{optim_lines}'
    )
    return config


def test_supervised_tokens_are_bracketed_in_a_pipe_under_no_color(
    tmp_path: Path, chat_target: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: in a pipe nothing marked what is supervised, and the legend spoke of green."""
    monkeypatch.setenv("NO_COLOR", "1")
    chat = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "And?"},
        {"role": "assistant", "content": "Bye."},
    ]
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": chat}) + "\n")
    config = chat_config(tmp_path, chat_target, data)
    argv = ["data", "preview", "--config", str(config), "--samples", "1"]
    assert run([*argv, "--json"]) == 0
    (sample,) = json.loads(capsys.readouterr().out)["samples"]
    mask = [bool(m) for m in sample["loss_mask"]]
    runs = supervised_text(byte_tokenizer(QWEN3_LIKE), sample["input_ids"], mask)
    assert len(runs) == 2  # the two answers
    assert run(argv) == 0
    out = capsys.readouterr().out
    assert "\x1b[" not in out  # a pipe: no styles at all, the brackets alone mark
    shown = out.split("supervised tokens", 2)[1]  # the sample, after its header line
    marked = [part.split(SUPERVISED_CLOSE)[0] for part in shown.split(SUPERVISED_OPEN)[1:]]
    assert marked == runs
    assert f"supervised tokens between {SUPERVISED_OPEN} and {SUPERVISED_CLOSE}" in out
    assert "in green" not in out


def test_a_small_file_is_previewed_though_its_held_out_split_is_under_a_batch(
    tmp_path: Path, chat_target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 39 U7: preview shows the whole file, not a split, yet it refused a 20-line file on the held-out
    rule ("holds out 1 of 20 sequences, fewer than one batch"); the rule is gone since (issue 38 D8: the
    last held-out batch is padded), and train's split holds the one sequence out."""
    from trainer.data.sources import split_data
    from trainer.runspec.config import load_config

    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    data = tmp_path / "chat.jsonl"
    data.write_text((json.dumps({"messages": chat}) + "\n") * 20)
    config = chat_config(tmp_path, chat_target, data, "eval_fraction = 0.05\n", "batch_size = 2\n")
    assert run(["data", "preview", "--config", str(config), "--samples", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["sequences"] == 20
    assert len(split_data(load_config(config)).eval_ids) == 1


def test_a_data_file_with_a_utf8_byte_order_mark_is_read(
    tmp_path: Path, chat_target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 39 U15: a BOM (Windows editors) made line 1 "not JSON", refusing the file."""
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    data = tmp_path / "chat.jsonl"
    data.write_bytes(b"\xef\xbb\xbf" + (json.dumps({"messages": chat}) + "\n").encode() * 2)
    config = chat_config(tmp_path, chat_target, data)
    assert run(["data", "preview", "--config", str(config), "--samples", "1", "--json"]) == 0, (
        capsys.readouterr()
    )
    shown = json.loads(capsys.readouterr().out)
    assert shown["counts"]["sequences"] == 2 and shown["samples"][0]["line"] == 1


class AnsweringEngine:
    """Answers every chat at once: the engine seam of `data regenerate`, no target decoding."""

    name = "fake"
    rows_at_once = 8

    def generate(self, chats: list[object]) -> list[object]:
        from trainer.regenerate.settings import Completion

        return [Completion("Hello!", 3, "stop") for _ in chats]

    def close(self) -> None:
        pass


def test_the_no_assistant_hint_is_a_command_that_works(
    tmp_path: Path, chat_target: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 39 U15: the hint for chat data with nothing to supervise was `data regenerate --prompts FILE
    --out FILE`, without the --config that command needs. Run as the hint says, then previewed."""
    from dflash_doctor.commands import data as data_command

    monkeypatch.setattr(data_command, "_engine_factory", lambda *a: AnsweringEngine)
    data = tmp_path / "questions.jsonl"
    data.write_text((json.dumps({"messages": [{"role": "user", "content": "Hi"}]}) + "\n") * 2)
    config = chat_config(tmp_path, chat_target, data)
    assert run(["data", "preview", "--config", str(config)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "has an assistant turn" in err
    hinted = err.split("dflash-doctor ", 1)[1].split(", then", 1)[0].split()
    assert hinted[:3] == ["data", "regenerate", "--config"], hinted
    answers = tmp_path / "answers.jsonl"
    argv = [{"CONFIG": str(config), "ANSWERS.jsonl": str(answers)}.get(word, word) for word in hinted]
    assert run(argv) == 0, capsys.readouterr()
    capsys.readouterr()
    again = ["data", "preview", "--config", str(config), "--set", f'data.path="{answers}"', "--json"]
    assert run(again) == 0, capsys.readouterr()
    assert json.loads(capsys.readouterr().out)["counts"]["answers"] == 2


@pytest.mark.parametrize(
    ("loops", "said"),
    [
        ("cut", "1 ending in a loop cut after its first period"),
        ("drop", "1 ending in a loop not supervised at all"),
    ],
)
def test_preview_counts_and_says_the_looping_answers_it_leaves_out(
    tmp_path: Path, chat_target: Path, capsys: pytest.CaptureFixture[str], loops: str, said: str
) -> None:
    looping = "Done. " + "ab" * 40
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": looping}]
    record = {"messages": chat, "generation": {"finish_reasons": ["length"]}}
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps(record) + "\n")
    config = chat_config(tmp_path, chat_target, data, f'seq_len = 192\nloops = "{loops}"\n')
    argv = ["data", "preview", "--config", str(config), "--samples", "1"]
    assert run([*argv, "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)["counts"]
    assert counts["answers_cut_at_length"] == 1
    assert (counts["answers_loop_cut"], counts["answers_loop_dropped"]) == (
        (1, 0) if loops == "cut" else (0, 1)
    )
    assert run(argv) == 0
    assert said in " ".join(capsys.readouterr().out.split())
