"""A record's `tools` (issue 38, Q6): `eval` renders them as a server does (`tools=` to the chat template);
`data regenerate`, whose engines take messages only, refuses them, naming the line and the way out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_base.errors import ConfigError
from tests.trainer.chat_fixtures import byte_tokenizer
from trainer.eval.prompts import chat_prompts, prompts_from_file
from trainer.regenerate.conversations import RecordError, parse_record
from trainer.regenerate.job import RegenerateError, scan_input

QWEN3 = (Path(__file__).parents[1] / "data" / "templates" / "qwen3.jinja").read_text()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CHAT = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "Sunny."},
]


def test_eval_renders_a_records_tools_as_a_server_does(tmp_path: Path) -> None:
    """Was: the tool definitions were dropped, so eval decoded from a prompt the target never sees."""
    tokenizer = byte_tokenizer(QWEN3)
    served = tokenizer.apply_chat_template(CHAT[:1], tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert "get_weather" in served  # the Qwen3 template writes the definitions into its system turn
    prompts = tmp_path / "prompts.jsonl"
    lines = [{"messages": CHAT[:1], "tools": TOOLS}, {"prompt": "Weather in Paris?", "tools": TOOLS}]
    prompts.write_text("".join(json.dumps(x) + "\n" for x in lines))
    got = prompts_from_file(str(prompts), tokenizer, {})
    assert [tokenizer.decode(p) for p in got] == [served, served]
    data = tmp_path / "chat.jsonl"
    data.write_text(
        json.dumps({"messages": CHAT, "tools": TOOLS}) + "\n" + json.dumps({"messages": CHAT}) + "\n"
    )
    held = chat_prompts(data, "data.path", [0, 1], tokenizer, {})  # eval's held-out prompts
    assert tokenizer.decode(held[0]) == served and "get_weather" not in tokenizer.decode(held[1])


def test_eval_refuses_tools_that_are_not_a_list_of_definitions(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi", "tools": "get_weather"}) + "\n")
    with pytest.raises(ConfigError, match=r'line 1: "tools" must be a list of tool definitions'):
        prompts_from_file(str(prompts), byte_tokenizer(QWEN3), {})


def test_regenerate_refuses_a_record_with_tools_naming_the_line(tmp_path: Path) -> None:
    """Was: regenerated without the definitions, the answers of another prompt than a server's."""
    with pytest.raises(
        RecordError, match=r'line 4: "tools": data regenerate does not render tool definitions'
    ):
        parse_record(4, json.dumps({"messages": CHAT, "tools": TOOLS}))
    assert (
        parse_record(5, json.dumps({"messages": CHAT, "tools": []})).messages[0]["content"]
        == CHAT[0]["content"]
    )
    prompts = tmp_path / "in.jsonl"
    prompts.write_text(
        json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"prompt": "x", "tools": TOOLS}) + "\n"
    )
    with pytest.raises(RegenerateError, match="line 2") as info:
        scan_input(prompts, "stop")
    assert "drop the line's" in str(info.value) and "--on-error skip" in str(info.value)
    scan = scan_input(prompts, "skip")
    assert [r.id for r in scan.records] == ["line-1"] and [b.line for b in scan.bad] == [2]
