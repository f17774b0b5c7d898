"""A tokenised source makes each sequence once: epochs after the first and every held-out scoring after the
first read it back instead of rendering the chat template and tokenising again (the trainer's host thread
does that work before it can queue the GPU's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.trainer.chat_fixtures import QWEN3_LIKE, byte_tokenizer
from tests.trainer.data.made_calls import calls_to
from trainer.data import sources
from trainer.data.sources import TokenizedSource, fit_to_length

CHATS = [
    [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": "A" * (5 + 7 * i)}]
    for i in range(6)
]


def _source(tmp_path: Path, seq_len: int) -> TokenizedSource:
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": chat}) + "\n" for chat in CHATS))
    return TokenizedSource(str(data), "chat", byte_tokenizer(QWEN3_LIKE), seq_len)


@pytest.mark.parametrize("seq_len", [24, 96])  # truncated, and padded
def test_a_sequence_read_again_is_the_same_and_not_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seq_len: int
) -> None:
    source = _source(tmp_path, seq_len)
    made = calls_to(source, "tokens", monkeypatch)
    first = [source.get(j) for j in range(len(source))]
    again = [source.get(j) for j in reversed(range(len(source)))][::-1]
    assert made == list(range(len(source)))  # once each
    for (ids, mask), (ids2, mask2) in zip(first, again, strict=True):
        assert ids.dtype == ids2.dtype == torch.int64 and mask2.dtype == torch.bool
        assert ids2.shape == (seq_len,) and torch.equal(ids, ids2) and torch.equal(mask, mask2)
    raw = TokenizedSource(source.path, "chat", source.tokenizer, seq_len)  # nothing kept yet
    for j, (ids, mask) in enumerate(again):
        expected = fit_to_length(*raw.tokens(j), seq_len)
        assert torch.equal(ids, expected[0]) and torch.equal(mask, expected[1])


def test_past_the_budget_sequences_are_made_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _source(tmp_path, 96)
    monkeypatch.setattr(sources, "KEPT_TOKENS", len(source.tokens(0)[0]) + 1)  # room for the first only
    made = calls_to(source, "tokens", monkeypatch)
    for _ in range(2):
        for j in range(3):
            source.get(j)
    assert made == [0, 1, 2, 1, 2]
    assert list(source.kept) == [0] and source.kept_tokens <= sources.KEPT_TOKENS
