"""The trainer's one-line warning when chat answers are left unsupervised because the template renders them
out of the context the target wrote them in (issue 38, Q1): with the count, quiet when there are none."""

from __future__ import annotations

import json
from pathlib import Path

from tests.trainer.chat_fixtures import QWEN3_LIKE, byte_tokenizer
from trainer.data.sources import TokenizedSource, out_of_context_warning

TWO_TURNS = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "See you."},
]


def _source(tmp_path: Path, records: int, **kwargs: object) -> TokenizedSource:
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": TWO_TURNS}) + "\n" for _ in range(records)))
    return TokenizedSource(str(data), "chat", byte_tokenizer(QWEN3_LIKE), 128, kwargs)


def test_answers_the_template_takes_out_of_their_context_are_counted_in_one_line(tmp_path: Path) -> None:
    """enable_thinking=false: each earlier answer was generated behind an empty think block the history
    drops, so "Hello!" stays unsupervised in every record: 3 of 6 answers."""
    line = out_of_context_warning(_source(tmp_path, 3, enable_thinking=False))
    assert line is not None and "\n" not in line
    assert line.startswith("warning: 3 of 6 answers in 3 chat records are not supervised")
    assert "answers_out_of_context" in line
    sampled = out_of_context_warning(_source(tmp_path, 3, enable_thinking=False), limit=2)
    assert sampled is not None and sampled.startswith(
        "warning: 2 of 4 answers in the first 2 of 3 chat records"
    )


def test_no_warning_when_every_answer_sits_in_its_context(tmp_path: Path) -> None:
    assert out_of_context_warning(_source(tmp_path, 3)) is None  # default kwargs: both answers supervised
