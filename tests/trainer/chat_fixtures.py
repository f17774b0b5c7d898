"""Tokenizers built offline for chat tests: byte-level (any text tokenises), with chat templates of our own.

`QWEN3_LIKE` behaves like Qwen3's template where it matters: it drops the think block of every assistant
turn before the last user message, writes one (empty if need be) on the last turn, renders tool calls and
tool responses, and with `enable_thinking=false` its generation prompt opens an empty think block.
`PLAIN` is a template with no tricks. The vocabulary (256 bytes + the markers) fits the tiny target's 512.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.data.chat import chat_sequence, sequence_token_spans, span_mask

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

NL = "{{ '\\n' }}"
QWEN3_LIKE = (
    "{%- set ns = namespace(last_query=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_query = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{%- set content = m.content or '' -%}{%- set reasoning = '' -%}"
    "{%- if '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}"
    "{{ '<think>\\n' + reasoning + '\\n</think>\\n\\n' }}"
    "{%- endif -%}"
    "{{ content }}"
    "{%- for call in m.tool_calls or [] -%}"
    "{{ '\\n<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' + call.arguments + '}\\n</tool_call>' }}"
    "{%- endfor -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' -%}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif -%}{%- endif -%}"
)

PLAIN = (
    "{%- for m in messages -%}{{ '### ' + m.role + ': ' + m.content + ' <|endoftext|>\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '### assistant: ' }}{%- endif -%}"
)


# A multi-turn reasoning chat with a system prompt: under QWEN3_LIKE the first think block is dropped.
REASONING = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Q1"},
    {"role": "assistant", "content": "<think>\nR1\n</think>\n\nA1"},
    {"role": "user", "content": "Q2"},
    {"role": "assistant", "content": "<think>\nR2\n</think>\n\nA2"},
]


def byte_tokenizer(template: str, folder: Path | None = None) -> Any:
    """A PreTrainedTokenizerFast: one token per byte plus SPECIAL and MARKERS; saved to `folder` if given."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=template
    )
    fast.add_special_tokens({"additional_special_tokens": SPECIAL})
    fast.add_tokens(MARKERS)
    if folder is not None:
        fast.save_pretrained(folder)
    return fast


def save_chat_target(folder: Path) -> Path:
    """The tiny target saved in `folder` as a Hugging Face folder with a byte-level tokenizer and QWEN3_LIKE's
    template (the chat tests' module-scoped `chat_target` fixtures)."""
    from trainer.target_model.tiny import build_embedded_target

    build_embedded_target("tiny", seed=0).save_pretrained(folder)
    byte_tokenizer(QWEN3_LIKE, folder)
    return folder


def supervised_text(tokenizer: Any, ids: list[int], mask: list[bool]) -> list[str]:
    """The supervised runs of tokens, each decoded (a leak into another turn shows as a longer run)."""
    runs: list[list[int]] = []
    previous = False
    for token, on in zip(ids, mask, strict=True):
        if on and not previous:
            runs.append([])
        if on:
            runs[-1].append(token)
        previous = on
    return [tokenizer.decode(run) for run in runs]


def chat_tokens_and_mask(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    template_kwargs: dict[str, Any] | None = None,
    where: str = "chat record",
    tools: list[dict[str, Any]] | None = None,
) -> tuple[list[int], list[bool]]:
    """Token ids of the conversation as trained and True on exactly what the target wrote: what a chat
    source makes of one record before its answers' ends are trimmed (`TokenizedSource.chat_tokens`)."""
    sequence = chat_sequence(tokenizer, messages, dict(template_kwargs or {}), tools, where)
    ids, token_spans = sequence_token_spans(tokenizer, sequence)
    return ids, span_mask(len(ids), token_spans)
