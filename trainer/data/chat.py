"""Chat records -> (token ids, loss mask) that supervise exactly the assistant turns, as the template renders them.

Each conversation is rendered once, as text, with the tokenizer's own chat template (and the run's
`data.chat_template_kwargs`, e.g. `{enable_thinking = false}`), then tokenised once: the ids are exactly
what `apply_chat_template(tokenize=True)` gives. The supervised span of an assistant turn runs from the end
of its role header to the end of its end-of-turn token, so it holds the content, any think block the
template keeps, tool calls, and the end-of-turn token; never system, user or tool text, never a header.

The template itself is asked what a header and an end-of-turn look like (`TemplateMarks`), by rendering a
probe conversation, instead of guessing them from token arithmetic: templates such as Qwen3's drop the think
blocks of earlier turns and add an empty one to the last, which shifts any span computed from the lengths
of partial renderings (the bug of issue 15). When the template's generation prompt goes further than the
role header (Qwen3 with `enable_thinking = false` opens `<think>\n\n</think>\n\n` itself), that text is
the server's, not the model's, and is not supervised either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dflash_base.errors import ConfigError
from trainer.spec.messages import messages_problem

_PROBE_USER, _PROBE_ANSWER, _PROBE_NEXT = "dflashprobeuser", "dflashprobeanswer", "dflashprobenext"


def render_chat(
    tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool, kwargs: dict[str, Any]
) -> str:
    """The template's text for `messages` (what `apply_chat_template(tokenize=True)` tokenises)."""
    return str(
        tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs
        )
    )


@dataclass(frozen=True)
class TemplateMarks:
    """What the template writes around an assistant turn's content."""

    header: str  # the role header, e.g. "<|im_start|>assistant\n"
    generation_prompt: str  # what the server appends before generating (the header, maybe more)
    end_of_turn: str  # e.g. "<|im_end|>"

    @classmethod
    def of(cls, tokenizer: Any, kwargs: dict[str, Any]) -> TemplateMarks:
        """Ask the template: render a probe conversation and read the header and end-of-turn off it."""
        user = [{"role": "user", "content": _PROBE_USER}]
        turn = [*user, {"role": "assistant", "content": _PROBE_ANSWER}]
        try:
            before = render_chat(tokenizer, user, False, kwargs)
            prompted = render_chat(tokenizer, user, True, kwargs)
            middle = render_chat(tokenizer, [*turn, {"role": "user", "content": _PROBE_NEXT}], False, kwargs)
            last = render_chat(tokenizer, turn, False, kwargs)
        except Exception as exc:  # jinja's errors (and a tokenizer without a template) share no base class
            raise ConfigError(
                f"data.kind: the tokenizer's chat template cannot render a user/assistant conversation: {exc}"
            ) from exc
        if not (middle.startswith(before) and prompted.startswith(before) and _PROBE_ANSWER in middle):
            raise ConfigError(
                "data.kind: the chat template renders a conversation's start differently as it grows; "
                'cannot locate assistant turns (pre-tokenise the data as data.kind = "jsonl" instead)'
            )
        generation_prompt = prompted[len(before) :]
        header = middle[len(before) : middle.index(_PROBE_ANSWER)]
        tail = last[last.index(_PROBE_ANSWER) + len(_PROBE_ANSWER) :].lstrip()
        end = _first_token_text(tokenizer, tail)
        if not header.strip() or not end:
            raise ConfigError(
                "data.kind: the chat template writes no assistant header or no end-of-turn marker; "
                'cannot locate assistant turns (pre-tokenise the data as data.kind = "jsonl" instead)'
            )
        return cls(header, generation_prompt, end)


def _first_token_text(tokenizer: Any, text: str) -> str:
    """The text of the first token of `text` (the end-of-turn token, when `text` follows a turn's content)."""
    if not text:
        return ""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = encoded["offset_mapping"]
    if not offsets:
        return ""
    start, end = offsets[0]
    return text[start:end]


def answer_text(message: dict[str, Any]) -> str:
    """The part of an assistant message every template renders: the content after any think block."""
    content = message.get("content") or ""
    return content.split("</think>")[-1].strip()


def assistant_spans(
    rendered: str, messages: list[dict[str, Any]], marks: TemplateMarks, where: str
) -> list[tuple[int, int]]:
    """[start, end) character spans of each assistant turn in `rendered`, in order.

    A turn starts after the next assistant header (and after the generation prompt's extra text when the
    template wrote it there) and ends after the next end-of-turn marker; its answer text must lie inside,
    else the template did something this reading does not understand: a ConfigError naming the record.
    """
    spans: list[tuple[int, int]] = []
    cursor = 0
    for number, message in enumerate(messages, start=1):
        if message.get("role") != "assistant":
            continue
        head = rendered.find(marks.header, cursor)
        if head < 0:
            raise ConfigError(f"{where}: assistant message {number}: its header is not in the rendering")
        start = head + len(marks.header)
        if marks.generation_prompt.startswith(marks.header) and rendered.startswith(
            marks.generation_prompt, head
        ):
            start = head + len(marks.generation_prompt)
        close = rendered.find(marks.end_of_turn, start)
        if close < 0:
            raise ConfigError(
                f"{where}: assistant message {number}: no end-of-turn after it in the rendering"
            )
        end = close + len(marks.end_of_turn)
        if answer_text(message) not in rendered[start:close]:
            raise ConfigError(
                f"{where}: assistant message {number}: its text is not where the chat template renders "
                "the turn (the template rewrote it or dropped it); fix the record or pre-tokenise the data"
            )
        content = message.get("content") or ""
        written = rendered.find(content, start, close) if content.strip() else -1
        if written > start and rendered[start:written].strip():
            # The template put text of its own before the answer (Qwen3: an empty think block before the last
            # answer), which the target did not write: the answer is supervised from where its own text starts.
            start = written
        spans.append((start, end))
        cursor = end
    return spans


def check_messages(messages: Any, where: str) -> list[dict[str, Any]]:
    """The messages of a valid conversation (trainer.spec.messages' rule), else a ConfigError naming the line."""
    problem = messages_problem(messages)
    if problem is not None:
        raise ConfigError(f"{where}: {problem}")
    return messages


def chat_tokens_and_mask(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    template_kwargs: dict[str, Any] | None = None,
    where: str = "chat record",
    marks: TemplateMarks | None = None,
) -> tuple[list[int], list[bool]]:
    """Token ids of the whole conversation and True on exactly the assistant turns' tokens.

    A token is supervised when it starts inside an assistant span (a token that straddles the header's
    end belongs to the header). `marks` may be passed in to probe the template once per data set.
    """
    kwargs = dict(template_kwargs or {})
    marks = marks or TemplateMarks.of(tokenizer, kwargs)
    try:
        rendered = render_chat(tokenizer, messages, False, kwargs)
    except Exception as exc:  # jinja raises its own errors (e.g. a template's raise_exception)
        raise ConfigError(f"{where}: the chat template cannot render this conversation: {exc}") from exc
    spans = assistant_spans(rendered, messages, marks, where)
    encoded = tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(encoded["input_ids"])
    mask = [any(start <= begin < end for start, end in spans) for begin, _ in encoded["offset_mapping"]]
    return ids, mask
