"""What the target did not write at an answer's end stays out of the loss: the end-of-turn token after an
answer cut at the length cap, and (data.loops = "cut") a looping answer's repeats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dflash_base.errors import ConfigError
from tests.trainer.chat_fixtures import QWEN3_LIKE, byte_tokenizer, supervised_text
from trainer.data.answer_ends import finish_reasons, trim_answer_ends
from trainer.data.degenerate import MAX_PERIOD, MIN_LOOP_TOKENS, loop_of
from trainer.data.sources import TokenizedSource
from trainer.runspec.config import parse_config

LOOP = "Done. " + "ab" * 40  # a 2-character loop of 80 characters: 80 byte tokens, 40 periods


def _record(answers: list[str], reasons: list[str] | None) -> dict[str, Any]:
    messages: list[dict[str, str]] = []
    for number, answer in enumerate(answers):
        messages += [{"role": "user", "content": f"Q{number}"}, {"role": "assistant", "content": answer}]
    record: dict[str, Any] = {"id": "x", "messages": messages}
    if reasons is not None:
        record["generation"] = {"finish_reasons": reasons}
    return record


def _source(tmp_path: Path, records: list[dict[str, Any]], loops: str = "keep") -> TokenizedSource:
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    return TokenizedSource(str(data), "chat", byte_tokenizer(QWEN3_LIKE), 512, loops=loops)


def _supervised(source: TokenizedSource, j: int = 0) -> list[str]:
    ids, mask = source.tokens(j)
    return supervised_text(source.tokenizer, ids, mask)


def test_an_answer_cut_at_the_length_cap_is_trained_without_the_end_of_turn_it_never_wrote(
    tmp_path: Path,
) -> None:
    source = _source(tmp_path, [_record(["Hello", "Unfinished sente"], ["stop", "length"])])
    # the first answer is history of the last here (Qwen3-like: both in their generation contexts)
    assert _supervised(source) == ["Hello<|im_end|>", "Unfinished sente"]
    assert source.chat_tokens(0).ends.unfinished == 1
    assert source.chat_tokens(0).ends.tokens_left_out == 1


def test_answers_that_stopped_or_carry_no_finish_reasons_keep_their_end_of_turn(tmp_path: Path) -> None:
    finished = _source(tmp_path, [_record(["Hello", "Bye"], ["stop", "stop"])])
    assert _supervised(finished) == ["Hello<|im_end|>", "Bye<|im_end|>"]
    plain = _source(tmp_path, [_record(["Hello", "Bye"], None)])  # not data regenerate's: nothing assumed
    assert _supervised(plain) == ["Hello<|im_end|>", "Bye<|im_end|>"]
    assert plain.chat_tokens(0).ends.unfinished == 0


def test_finish_reasons_that_do_not_match_the_answers_are_ignored() -> None:
    assert finish_reasons(_record(["a", "b"], ["stop"]), 2) is None
    assert finish_reasons(_record(["a"], [3]), 1) is None  # type: ignore[list-item]
    assert finish_reasons({"generation": "x"}, 1) is None
    assert finish_reasons(_record(["a"], ["length"]), 1) == ["length"]


def test_loops_keep_trains_the_whole_looping_answer(tmp_path: Path) -> None:
    source = _source(tmp_path, [_record([LOOP], ["length"])], loops="keep")
    assert _supervised(source) == [LOOP]  # the end-of-turn after the cap still left out
    assert source.chat_tokens(0).ends.loops_cut == 0


def test_loops_cut_keeps_one_period_and_drops_the_repeats_and_the_end_of_turn(tmp_path: Path) -> None:
    source = _source(tmp_path, [_record([LOOP], ["length"])], loops="cut")
    kept = _supervised(source)
    assert kept == ["Done. ab"]
    ends = source.chat_tokens(0).ends
    assert (ends.loops_cut, ends.unfinished) == (1, 1)
    assert ends.tokens_left_out == len(LOOP) + 1 - len("Done. ab")  # the repeats and the end-of-turn
    ids, _ = source.tokens(0)
    assert LOOP in source.tokenizer.decode(ids)  # the repeats stay in the sequence, as context


def test_loops_drop_supervises_no_token_of_a_looping_answer_and_keeps_the_others(tmp_path: Path) -> None:
    source = _source(tmp_path, [_record(["Hello", LOOP, "Bye"], ["stop", "length", "stop"])], loops="drop")
    assert _supervised(source) == ["Hello<|im_end|>", "Bye<|im_end|>"]
    ends = source.chat_tokens(0).ends
    assert (ends.loops_dropped, ends.loops_cut, ends.unfinished) == (1, 0, 1)
    assert ends.tokens_left_out == len(LOOP) + 1  # every token of it, the end-of-turn too
    ids, _ = source.tokens(0)
    assert LOOP in source.tokenizer.decode(ids)  # still in the sequence: "Bye" was written after it


def test_loops_cut_leaves_answers_that_do_not_loop_alone(tmp_path: Path) -> None:
    code = "\n".join(f"x{i} = {i * 7}" for i in range(30))  # lines of one shape that progress
    assert loop_of(list(code.encode()), MAX_PERIOD, MIN_LOOP_TOKENS) is None  # its tokens end in no loop
    source = _source(tmp_path, [_record([code, "Bye"], ["stop", "stop"])], loops="cut")
    assert _supervised(source) == [code + "<|im_end|>", "Bye<|im_end|>"]


def test_trim_answer_ends_rejects_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="loops must be one of"):
        trim_answer_ends([1, 2], [True, True], [range(2)], [0], None, "trim")


def test_data_loops_is_a_chat_option_named_in_its_errors() -> None:
    chat = {"kind": "chat", "path": "c.jsonl", "loops": "cut"}
    assert parse_config({"target": {"path": "/m"}, "data": chat, "optim": {"steps": 1}}).data.loops == "cut"
    with pytest.raises(ConfigError, match=r"data\.loops: must be one of"):
        parse_config({"target": {"path": "/m"}, "data": {**chat, "loops": "trim"}, "optim": {"steps": 1}})
    with pytest.raises(ConfigError, match=r'data\.loops: only for data\.kind = "chat"'):
        parse_config({"data": {"kind": "random", "loops": "cut"}, "optim": {"steps": 1}})
