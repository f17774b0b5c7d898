"""The training data is checked at the gate, before any model loads: a lone surrogate names its line, and chat
data with no assistant turn (nothing to supervise) is refused (issue 29)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_base.errors import ConfigError
from dflash_doctor.cli import run
from tests.trainer.input_files import LONE, chats, run_config
from trainer.runspec.config import load_config
from trainer.runspec.data_files import check_data_file


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def target_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3 target with a 512-word tokenizer and a chat template; context 4096."""
    from bench.lib.target_folder import make_target_folder

    return make_target_folder(tmp_path_factory.mktemp("target"))


@pytest.mark.parametrize(
    ("kind", "line"),
    [
        ("chat", '{"messages": [{"role": "user", "content": ' + LONE + "}]}"),
        (
            "chat",
            '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": '
            + LONE
            + "}]}",
        ),
        ("text", '{"text": ' + LONE + "}"),
    ],
)
def test_a_lone_surrogate_in_training_data_is_refused_at_the_gate(
    tmp_path: Path, kind: str, line: str
) -> None:
    """Was: `train --dry-run` passed it, `data preview` exit 3."""
    data = chats(tmp_path / "d.jsonl", 3, extra=line + "\n")
    if kind == "text":
        data.write_text('{"text": "w1 w2"}\n' * 3 + line + "\n")
    with pytest.raises(ConfigError, match=r"line 4: .*lone surrogate"):
        check_data_file(kind, str(data), 512)


def test_chat_data_without_any_assistant_turn_is_refused_for_training(
    target_folder: Path, tmp_path: Path
) -> None:
    """Was: `data preview` 0% supervised without a word, `train --dry-run` exit 0."""
    data = chats(tmp_path / "d.jsonl", 20, answered=False)
    config = run_config(tmp_path, target_folder, data)
    with pytest.raises(
        ConfigError, match="none of its 20 conversations has an assistant turn: nothing to supervise"
    ):
        load_config(config)
    assert run(["train", "--config", str(config), "--dry-run", "--no-deep"]) == 2
    chats(data, 19, answered=False, extra=chats(tmp_path / "one.jsonl", 1).read_text())  # one answered: fine
    load_config(config)
