"""Chat supervision: exactly the assistant turns as the template renders them, nothing of the other roles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dflash_base.errors import ConfigError
from tests.trainer.chat_fixtures import (
    PLAIN,
    QWEN3_LIKE,
    REASONING,
    byte_tokenizer,
    chat_tokens_and_mask,
    supervised_text,
)
from trainer.data.chat import TemplateMarks
from trainer.data.sources import TokenizedSource
from trainer.runspec.config import parse_config

TWO_TURNS = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "See you."},
]


def _supervised(template: str, messages: list[dict[str, Any]], **kwargs: Any) -> list[str]:
    tokenizer = byte_tokenizer(template)
    ids, mask = chat_tokens_and_mask(tokenizer, messages, kwargs)
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    context = tokenizer.apply_chat_template(
        messages[:last], tokenize=True, add_generation_prompt=True, **kwargs
    )
    context = context["input_ids"] if hasattr(context, "keys") else context
    # the last answer follows exactly the template's generation prompt, as the target wrote it (Q1)
    assert ids[: len(context)] == list(context) and mask[len(context)]
    return supervised_text(tokenizer, ids, mask)


def test_qwen3_like_two_turns_supervise_each_answer_and_its_end_of_turn() -> None:
    # the old span arithmetic supervised "Hello!<|im_end|>\n<|im_start|>user\n" here; and the empty think
    # block the template puts before the last answer is the template's, not the target's (issue 27, D1)
    assert _supervised(QWEN3_LIKE, TWO_TURNS) == ["Hello!<|im_end|>", "See you.<|im_end|>"]


def test_qwen3_like_reasoning_keeps_the_last_think_block_and_never_the_user_turn() -> None:
    # A1 was written after its think block (R1), which the history drops: A1 stays context (issue 38, Q1)
    got = _supervised(QWEN3_LIKE, REASONING)
    assert got == ["<think>\nR2\n</think>\n\nA2<|im_end|>"]
    assert not any("Q2" in run or "Be brief" in run or "user" in run for run in got)


def test_enable_thinking_false_leaves_the_servers_empty_think_block_unsupervised() -> None:
    # "Hello!" was generated behind the prompt's empty think block, which the history drops (issue 38, Q1)
    got = _supervised(QWEN3_LIKE, TWO_TURNS, enable_thinking=False)
    assert got == ["See you.<|im_end|>"]


def test_tool_turns_supervise_the_call_and_never_the_tool_response() -> None:
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [{"name": "weather", "arguments": '{"city": "Oslo"}'}],
        },
        {"role": "tool", "content": "rain"},
        {"role": "assistant", "content": "It rains."},
    ]
    got = _supervised(QWEN3_LIKE, messages)
    first, second = got
    assert first.startswith("Let me look.\n<tool_call>") and first.endswith("</tool_call><|im_end|>")
    assert second == "It rains.<|im_end|>"  # not the template's empty think block before it
    assert not any("rain<" in run or "tool_response" in run for run in got)


def test_plain_template_multi_turn_with_a_system_prompt() -> None:
    messages = [{"role": "system", "content": "Sys"}, *TWO_TURNS]
    assert _supervised(PLAIN, messages) == ["Hello! <|endoftext|>", "See you. <|endoftext|>"]


def test_template_marks_are_read_off_the_template() -> None:
    marks = TemplateMarks.of(byte_tokenizer(QWEN3_LIKE), {"enable_thinking": False})
    assert marks.template_text == ""  # the generation prompt already wrote the empty think block
    assert marks.generation_prompt == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert marks.end_of_turn == "<|im_end|>"


def test_an_assistant_text_the_rendering_lacks_is_an_error_naming_the_line(tmp_path: Path) -> None:
    tokenizer = byte_tokenizer(QWEN3_LIKE)
    dropping = QWEN3_LIKE.replace(
        "{{ content }}", "{{ content.replace('Hello', 'Howdy') }}"
    )  # rewrites answers
    tokenizer.chat_template = dropping
    data = tmp_path / "chat.jsonl"
    data.write_text(
        json.dumps({"messages": TWO_TURNS[:2]}) + "\n" + json.dumps({"messages": TWO_TURNS}) + "\n"
    )
    source = TokenizedSource(str(data), "chat", tokenizer, 64)
    with pytest.raises(ConfigError, match=r"chat\.jsonl line 1: assistant message 2: its text is not"):
        source.get(0)


def test_malformed_messages_name_the_line(tmp_path: Path) -> None:
    data = tmp_path / "chat.jsonl"
    data.write_text(
        json.dumps({"messages": TWO_TURNS}) + "\n" + json.dumps({"messages": [{"content": "x"}]}) + "\n"
    )
    source = TokenizedSource(str(data), "chat", byte_tokenizer(QWEN3_LIKE), 64)
    source.get(0)
    with pytest.raises(ConfigError, match=r"line 2: messages\[0\]\.role must be one of"):
        source.get(1)


def test_chat_template_kwargs_reach_the_template(tmp_path: Path) -> None:
    chat = {"kind": "chat", "path": "chat.jsonl", "chat_template_kwargs": {"enable_thinking": False}}
    cfg = parse_config({"target": {"path": "/models/x"}, "data": chat, "optim": {"steps": 1}})
    assert cfg.data.chat_template_kwargs == {"enable_thinking": False}
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": TWO_TURNS}) + "\n")
    tokenizer = byte_tokenizer(QWEN3_LIKE)
    source = TokenizedSource(str(data), "chat", tokenizer, 96, cfg.data.chat_template_kwargs)
    ids, mask = source.tokens(0)
    assert supervised_text(tokenizer, ids, mask) == ["See you.<|im_end|>"]  # Q1: "Hello!" out of context
    with pytest.raises(ConfigError, match=r"data\.chat_template_kwargs: must be a table"):
        parse_config({"data": {"chat_template_kwargs": "enable_thinking"}, "optim": {"steps": 1}})
    with pytest.raises(ConfigError, match=r'data\.chat_template_kwargs: only for data.kind = "chat"'):
        parse_config({"data": {"chat_template_kwargs": {"enable_thinking": False}}, "optim": {"steps": 1}})


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "assistant", "content": "a"}],  # an answer before any question
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
            {"role": "assistant", "content": "b"},
        ],
        [{"role": "user", "content": "q"}, {"role": "bot", "content": "a"}],
        [{"role": "user", "content": None}],
        [{"role": "system", "content": "s"}],  # no user turn
    ],
)
def test_one_rule_for_chat_messages_wherever_they_enter(tmp_path: Path, messages: list[dict]) -> None:
    """A conversation `data regenerate` refuses is refused as training data too, with the same reason
    (they had two rules: training took any role in any order)."""
    from trainer.regenerate.conversations import RecordError, parse_record
    from trainer.runspec.data_files import check_data_file

    line = json.dumps({"messages": messages})
    with pytest.raises(RecordError) as refused_by_regenerate:
        parse_record(1, line)
    data = tmp_path / "chat.jsonl"
    data.write_text(line + "\n")
    with pytest.raises(ConfigError) as refused_for_training:
        check_data_file("chat", str(data))
    assert refused_by_regenerate.value.message in refused_for_training.value.message


def test_an_assistant_tool_call_without_content_is_a_valid_turn() -> None:
    from trainer.runspec.messages import messages_problem

    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
    }
    turns = [{"role": "user", "content": "q"}, call, {"role": "tool", "content": "42"}]
    assert messages_problem(turns) is None
    assert messages_problem([{"role": "user", "content": "q"}, {**call, "tool_calls": []}]) is not None


def test_regenerated_data_must_be_rendered_with_the_template_arguments_it_was_made_with(
    tmp_path: Path,
) -> None:
    """D1 (issue 27): answers regenerated with {} trained under {enable_thinking = false} (or the other way)
    sit in a context the target did not write them in; the gate refuses it, naming the line and both."""
    from trainer.runspec.data_files import check_data_file

    record = {
        "id": "a",
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        "generation": {"target": "/models/x", "chat_template_kwargs": {}, "max_new_tokens": 8},
    }
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps(record) + "\n")
    check_data_file("chat", str(data), template_kwargs={})  # made as it is rendered: fine
    check_data_file("chat", str(data))  # no run arguments given (e.g. a file checked on its own)
    with pytest.raises(ConfigError) as err:
        check_data_file("chat", str(data), template_kwargs={"enable_thinking": False})
    message = " ".join(err.value.message.split())
    assert (
        "line 1: regenerated with chat_template_kwargs {}" in message
        and '{"enable_thinking": false}' in message
    )
    hand_made = {"messages": record["messages"]}  # no `generation`: not ours to judge
    data.write_text(json.dumps(hand_made) + "\n")
    check_data_file("chat", str(data), template_kwargs={"enable_thinking": False})
