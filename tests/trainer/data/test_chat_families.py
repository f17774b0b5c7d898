"""Chat supervision found from the renders: every family's published template, and one no rule knows (issue 38).

Each template is a fixture file (templates/, written from the models' tokenizer_config.json); the tokenizer is
character-level (one token per byte, plus the family's special tokens), so the supervised runs compared below
are the mask, token by token: each answer and the end-of-turn token its template writes, nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dflash_base.errors import ConfigError
from tests.trainer.chat_fixtures import chat_tokens_and_mask, supervised_text
from trainer.data.chat import chat_sequence
from trainer.data.sources import TokenizedSource

TEMPLATES = Path(__file__).parent / "templates"
TWO_TURNS = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "See you."},
]
R1_EOS = "<｜end▁of▁sentence｜>"
R1_SPECIAL = ["<｜begin▁of▁sentence｜>", R1_EOS, "<｜User｜>", "<｜Assistant｜>"]
PHI3_SPECIAL = ["<s>", "<|endoftext|>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
IM = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# fixture -> (special tokens, bos, eos, the end-of-turn text supervised after each answer)
FAMILIES: dict[str, tuple[list[str], str, str, str]] = {
    "llama3": (
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
        "<|begin_of_text|>",
        "<|eot_id|>",
        "<|eot_id|>",
    ),
    "llama31": (
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"],
        "<|begin_of_text|>",
        "<|eot_id|>",
        "<|eot_id|>",
    ),
    "gemma": (["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"], "<bos>", "<eos>", "<end_of_turn>"),
    "qwen25": (IM, "<|endoftext|>", "<|im_end|>", "<|im_end|>"),
    "qwen3": (IM, "<|endoftext|>", "<|im_end|>", "<|im_end|>"),
    "deepseek_r1_early": (R1_SPECIAL, R1_SPECIAL[0], R1_EOS, R1_EOS),
    "phi4": ([*IM, "<|im_sep|>"], "<|endoftext|>", "<|im_end|>", "<|im_end|>"),
    "chatml": (IM, "<|endoftext|>", "<|im_end|>", "<|im_end|>"),
    "smollm2": (IM, "<|endoftext|>", "<|im_end|>", "<|im_end|>"),
    "command_r": (
        [
            "<BOS_TOKEN>",
            "<|END_OF_TURN_TOKEN|>",
            "<|START_OF_TURN_TOKEN|>",
            "<|USER_TOKEN|>",
            "<|CHATBOT_TOKEN|>",
            "<|SYSTEM_TOKEN|>",
        ],
        "<BOS_TOKEN>",
        "<|END_OF_TURN_TOKEN|>",
        "<|END_OF_TURN_TOKEN|>",
    ),
    "granite3": (
        ["<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>"],
        "<|end_of_text|>",
        "<|end_of_text|>",
        "<|end_of_text|>",
    ),
    # refused before issue 38
    "mistral_v01": (["<s>", "</s>"], "<s>", "</s>", "</s>"),
    "mistral_v02": (["<s>", "</s>"], "<s>", "</s>", "</s>"),
    "llama2": (["<s>", "</s>"], "<s>", "</s>", " </s>"),
    "phi3_medium": (PHI3_SPECIAL, "<s>", "<|endoftext|>", "<|end|>"),
    "phi3_mini_early": (PHI3_SPECIAL, "<s>", "<|endoftext|>", "<|end|>"),
    "phi3_mini": (PHI3_SPECIAL, "<s>", "<|endoftext|>", "<|end|>"),
    "phi35_mini": (PHI3_SPECIAL, "<s>", "<|endoftext|>", "<|end|>"),
    "phi4_mini": (PHI3_SPECIAL, "<s>", "<|endoftext|>", "<|end|>"),
}

# A template written for this test, like no family: its own header and closing marker.
UNKNOWN = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'assistant' %}{{ '~~ bot says ~~ ' + m.content + "
    "' <<over>>\\n\\n' }}{% else %}{{ '~~ ' + m.role + ' asks ~~ ' + m.content + ' ;;\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '~~ bot says ~~ ' }}{% endif %}"
)


def char_tokenizer(template: str, special: list[str], bos: str, eos: str) -> Any:
    """One token per byte, plus the family's special tokens (each one token, as in the real vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=template)
    fast.add_special_tokens({"additional_special_tokens": sorted(set([*special, bos, eos]))})
    fast.bos_token, fast.eos_token = bos, eos
    return fast


def family(name: str) -> Any:
    special, bos, eos, _ = FAMILIES[name]
    return char_tokenizer((TEMPLATES / f"{name}.jinja").read_text(), special, bos, eos)


def supervised(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> list[str]:
    """The supervised runs; the sequence starts with exactly the last answer's generation context (Q1)."""
    ids, mask = chat_tokens_and_mask(tokenizer, messages, kwargs)
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    context = tokenizer.apply_chat_template(
        messages[:last], tokenize=False, add_generation_prompt=True, **kwargs
    )
    context_ids = tokenizer(context, add_special_tokens=False)["input_ids"]
    assert ids[: len(context_ids)] == context_ids
    between = ids[len(context_ids) : mask.index(True, len(context_ids))]
    assert not tokenizer.decode(between).strip()  # the answer follows the prompt (a template's space at most)
    return supervised_text(tokenizer, ids, mask)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_supervises_each_answer_and_its_end_of_turn(name: str) -> None:
    end = FAMILIES[name][3]
    assert supervised(family(name), TWO_TURNS) == [f"Hello!{end}", f"See you.{end}"]


def test_deepseek_r1_as_vllm_ships_it_trains_the_last_answer_behind_its_think_prompt() -> None:
    """Its generation prompt opens `<think>\\n`, which the history never shows: only the last answer sits in
    the context it was generated in; the earlier one stays (unsupervised) history."""
    tokenizer = char_tokenizer(
        (TEMPLATES / "deepseek_r1.jinja").read_text(), R1_SPECIAL, R1_SPECIAL[0], R1_EOS
    )
    assert supervised(tokenizer, TWO_TURNS) == [f"See you.{R1_EOS}"]
    sequence = chat_sequence(tokenizer, TWO_TURNS, {})
    assert sequence.text.endswith(f"<｜Assistant｜><think>\nSee you.{R1_EOS}")
    assert (sequence.answers, sequence.out_of_context) == (2, 1)


def test_a_template_no_family_rule_knows() -> None:
    tokenizer = char_tokenizer(UNKNOWN, ["<<over>>", "<bos>"], "<bos>", "<<over>>")
    system = [{"role": "system", "content": "Sys"}, *TWO_TURNS]
    assert supervised(tokenizer, system) == ["Hello! <<over>>", "See you. <<over>>"]


def test_qwen3_reasoning_content_rendered_as_think_is_supervised() -> None:
    """Q3: the template renders `reasoning_content` as a think block: the target wrote it."""
    messages = [*TWO_TURNS[:3], {"role": "assistant", "content": "See you.", "reasoning_content": "R2"}]
    assert supervised(family("qwen3"), messages) == [
        "Hello!<|im_end|>",
        "<think>\nR2\n</think>\n\nSee you.<|im_end|>",
    ]


@pytest.mark.parametrize("answer", ["think", "hi", "in", "n"])
def test_a_short_answer_inside_the_templates_own_text_is_located_by_position(answer: str) -> None:
    """Q4: "think" occurs in the template's empty `<think>\\n\\n</think>\\n\\n`; searching for the text made
    that block supervised."""
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": answer}]
    assert supervised(family("qwen3"), messages) == [f"{answer}<|im_end|>"]


def test_qwen3_enable_thinking_false_keeps_the_servers_empty_think_block_as_context() -> None:
    got = supervised(family("qwen3"), TWO_TURNS, enable_thinking=False)
    assert got == ["See you.<|im_end|>"]  # "Hello!" was generated behind the empty block the history drops


def test_a_records_tools_reach_the_template(tmp_path: Path) -> None:
    """Q6: the tool definitions are rendered as a server renders them, and the call is supervised."""
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
    call = {"function": {"name": "weather", "arguments": {"city": "Oslo"}}}
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "rain"},
        {"role": "assistant", "content": "It rains."},
    ]
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": messages, "tools": tools}) + "\n")
    tokenizer = family("qwen25")
    ids, mask = TokenizedSource(str(data), "chat", tokenizer, 4096).tokens(0)
    assert '"name": "weather", "parameters"' in tokenizer.decode(ids)  # the definitions are in the prompt
    assert supervised_text(tokenizer, ids, mask) == [
        '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>',
        "It rains.<|im_end|>",
    ]
    data.write_text(json.dumps({"messages": messages, "tools": "weather"}) + "\n")
    with pytest.raises(ConfigError, match=r'line 1: "tools" must be a list of tool definitions'):
        TokenizedSource(str(data), "chat", tokenizer, 4096).tokens(0)


def test_a_template_that_writes_no_end_of_turn_is_refused_naming_why() -> None:
    no_end = "{% for m in messages %}{{ m.role + ': ' + m.content + '\\n' }}{% endfor %}"
    tokenizer = char_tokenizer(no_end, [], "<s>", "</s>")
    with pytest.raises(ConfigError, match="writes nothing after an assistant message to end its turn"):
        chat_tokens_and_mask(tokenizer, TWO_TURNS)


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("llama31", '{"name": "weather", "parameters": {"city": "Oslo"}}<|eot_id|>'),
        ("qwen3", '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>'),
    ],
)
def test_tool_calls_with_the_records_tools_are_supervised_and_the_tool_result_is_not(
    name: str, call: str
) -> None:
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Oslo"}}}],
        },
        {"role": "tool", "content": "rain"},
        {"role": "assistant", "content": "It rains."},
    ]
    tokenizer = family(name)
    sequence = chat_sequence(tokenizer, messages, {}, tools)
    assert '"parameters": {}' in sequence.text.split("Weather?")[0]  # the definitions, before the question
    ids, mask = chat_tokens_and_mask(tokenizer, messages, {}, tools=tools)
    end = FAMILIES[name][3]
    assert supervised_text(tokenizer, ids, mask) == [call, f"It rains.{end}"]
