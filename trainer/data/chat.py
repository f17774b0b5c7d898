"""Chat records -> (token ids, loss mask) that supervise exactly what the target wrote, found from the renders.

No family rules: each assistant message is located by asking the template itself. For answer i the
template renders (run's `data.chat_template_kwargs` and the record's `tools` passed every time):

- `context`: the conversation before it with the generation prompt, the text the target continued from
  (as `data regenerate` and a server render it);
- `own`: the conversation ending with the answer, and two `probes` ending with sentinel contents instead.

Where the two probes part is where the template puts a message's content; their common end is what the
template writes after it (its first token is the end-of-turn token). Everything is found by position and
difference, never by searching for the answer's text (issue 38, Q4). The template's own text before the
content (Qwen3's empty `<think>\n\n</think>\n\n` on the last turn) is left out unless the message changed
it (a rendered `reasoning_content`, Q3, is the target's). Each answer is trained in the context it was
generated in (Q1): the sequence is the last answer's context followed by that answer, and an earlier answer
is supervised only where that sequence holds it right after its own generation context; one the template
re-renders differently in the history (Qwen3 drops think blocks) stays context, unsupervised, and counted.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

from dflash_base.errors import ConfigError
from trainer.runspec.messages import messages_problem

# Two sentinels that differ in their first and last character: where the probes part is the content's place.
_SENTINELS = ("Xdflashsentinel1X", "Ydflashsentinel2Y")
_PROBE_CONVERSATION = [
    {"role": "user", "content": "dflashprobeuser1"},
    {"role": "assistant", "content": "dflashprobeanswer1"},
    {"role": "user", "content": "dflashprobeuser2"},
    {"role": "assistant", "content": "dflashprobeanswer2"},
]
_JSONL_ROUTE = 'pre-tokenise the data with a loss mask as data.kind = "jsonl" (trainer.data.pretokenize.write_pretokenized writes it)'


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    generation_prompt: bool,
    kwargs: dict[str, Any],
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The template's text for `messages` (what `apply_chat_template(tokenize=True)` tokenises)."""
    extra = {"tools": tools} if tools else {}
    return str(
        tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, **extra, **kwargs
        )
    )


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _common_suffix(a: str, b: str, limit: int) -> int:
    i = 0
    while i < limit and a[-1 - i] == b[-1 - i]:
        i += 1
    return i


def _first_token_text(tokenizer: Any, text: str) -> str:
    """The text of the first token of `text` (the end-of-turn token, when `text` follows a turn's content)."""
    if not text:
        return ""
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    if not offsets:
        return ""
    start, end = offsets[0]
    return text[start:end]


@dataclass(frozen=True)
class LocatedAnswer:
    """One assistant message: the context it was generated from and the text the target wrote after it."""

    context: str  # the conversation before it, with the generation prompt
    written: str  # its content (and rendered reasoning, tool calls) through the end-of-turn token
    template_text: str  # what the template writes itself between the context and the content (not supervised)
    end_of_turn: str  # the end-of-turn token's text (with the whitespace the template puts before it)


def locate_answer(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    index: int,
    kwargs: dict[str, Any],
    tools: list[dict[str, Any]] | None,
    where: str,
) -> LocatedAnswer:
    """Answer `messages[index]` located by difference between renders (see the module docstring)."""
    before = messages[:index]
    probes = [[*before, {"role": "assistant", "content": s}] for s in _SENTINELS]
    try:
        context = render_chat(tokenizer, before, True, kwargs, tools)
        own = render_chat(tokenizer, messages[: index + 1], False, kwargs, tools)
        probe_a, probe_b = (render_chat(tokenizer, p, False, kwargs, tools) for p in probes)
    except Exception as exc:  # jinja's errors (and a tokenizer without a template) share no base class
        raise ConfigError(f"{where}: the chat template cannot render this conversation: {exc}") from exc
    number = f"{where}: assistant message {index + 1}"
    content_at = _common_prefix(probe_a, probe_b)  # where the template puts a message's content
    header_end = _common_prefix(context, probe_a)  # where the generation prompt and the turn agree
    if header_end > content_at or not own.startswith(probe_a[:header_end]):
        raise ConfigError(
            f"{number}: the chat template renders the conversation before it differently once the answer "
            f"follows (its history is not a prefix of the longer rendering); {_JSONL_ROUTE}"
        )
    after = _common_suffix(probe_a, probe_b, len(probe_a) - content_at)  # what follows the content
    closing = probe_a[len(probe_a) - after :]
    end_of_turn = _first_token_text(tokenizer, closing.lstrip())
    if not end_of_turn:
        raise ConfigError(
            f"{number}: the chat template writes nothing after an assistant message to end its turn, so the "
            f"target's stop is not in the rendering; {_JSONL_ROUTE}"
        )
    if not own.endswith(closing) or len(own) - after < header_end:
        raise ConfigError(
            f"{number}: the chat template ends this message differently from a plain one (it rewrote or "
            f"dropped it); fix the record or {_JSONL_ROUTE}"
        )
    template_text = probe_a[header_end:content_at]
    start = header_end
    if own.startswith(template_text, header_end):
        start += len(template_text)  # the template's own text, unchanged by this message: not the target's
        if not template_text.strip():
            context += template_text  # a space before the content (Llama 2) stays, as unsupervised text
    eot_end = len(own) - after + len(closing) - len(closing.lstrip()) + len(end_of_turn)
    written = own[start:eot_end]
    if answer_text(messages[index]) not in written:  # a check of what was located, never how it is located
        raise ConfigError(
            f"{number}: its text is not where the chat template renders the turn (the template rewrote it "
            f"or dropped it); fix the record or {_JSONL_ROUTE}"
        )
    return LocatedAnswer(context, written, template_text, end_of_turn)


def answer_text(message: dict[str, Any]) -> str:
    """The part of an assistant message every template renders: the content after any think block."""
    content = message.get("content") or ""
    return content.split("</think>")[-1].strip()


@dataclass(frozen=True)
class ChatSequence:
    """A conversation as trained: its text, the supervised character spans, and the answers left out."""

    text: str
    spans: list[tuple[int, int]]
    answers: int  # assistant messages in the record
    out_of_context: int  # answers whose generation context the sequence does not hold (not supervised)
    # which assistant message (0-based, among the record's assistant messages) each span supervises
    span_answers: tuple[int, ...] = ()


def chat_sequence(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    kwargs: dict[str, Any],
    tools: list[dict[str, Any]] | None = None,
    where: str = "chat record",
) -> ChatSequence:
    """The last answer's generation context and that answer, then the rest of the conversation where the
    template renders it as a continuation; earlier answers supervised where they sit in their own context."""
    indices = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    try:
        whole = render_chat(tokenizer, messages, False, kwargs, tools)
    except Exception as exc:  # jinja raises its own errors (e.g. a template's raise_exception)
        raise ConfigError(f"{where}: the chat template cannot render this conversation: {exc}") from exc
    if not indices:
        return ChatSequence(whole, [], 0, 0)
    located = [locate_answer(tokenizer, messages, i, kwargs, tools, where) for i in indices]
    last = located[-1]
    text = last.context + last.written
    if whole.startswith(text):
        text = whole  # what follows the last answer (its newline, a closing eos, later tool turns)
    spans: list[tuple[int, int]] = []
    span_answers: list[int] = []
    for number, answer in enumerate(located):
        start = len(answer.context)
        if text.startswith(answer.context) and text.startswith(answer.written, start):
            spans.append((start, start + len(answer.written)))
            span_answers.append(number)
    return ChatSequence(text, spans, len(located), len(located) - len(spans), tuple(span_answers))


def check_tools(tools: Any, where: str) -> list[dict[str, Any]] | None:
    """A record's `tools` (definitions the template renders, as a server passes them), else a ConfigError."""
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ConfigError(f'{where}: "tools" must be a list of tool definitions (JSON objects)')
    return tools


@dataclass(frozen=True)
class TemplateMarks:
    """What the template writes around a probe answer: checked once per data set, before any work."""

    generation_prompt: str  # what the server appends after the history before the target writes
    template_text: str  # what the template writes itself before the last answer's content
    end_of_turn: str  # e.g. "<|im_end|>"

    @classmethod
    def of(cls, tokenizer: Any, kwargs: dict[str, Any]) -> TemplateMarks:
        """Locate the answers of a probe conversation; a template that cannot be read raises, naming why."""
        where = "data.kind: the chat template (probe conversation)"
        sequence = chat_sequence(tokenizer, _PROBE_CONVERSATION, kwargs, None, where)
        if not sequence.spans:
            raise ConfigError(f"{where}: no answer sits where it was generated; {_JSONL_ROUTE}")
        last = locate_answer(tokenizer, _PROBE_CONVERSATION, 3, kwargs, None, where)
        history = render_chat(tokenizer, _PROBE_CONVERSATION[:3], False, kwargs)
        prompt = last.context[_common_prefix(history, last.context) :]
        return cls(prompt, last.template_text, last.end_of_turn)


def check_messages(messages: Any, where: str) -> list[dict[str, Any]]:
    """The messages of a valid conversation (trainer.runspec.messages' rule), else a ConfigError naming the line."""
    problem = messages_problem(messages)
    if problem is not None:
        raise ConfigError(f"{where}: {problem}")
    return messages


def sequence_token_spans(tokenizer: Any, sequence: ChatSequence) -> tuple[list[int], list[range]]:
    """Token ids of the sequence's text and, per supervised span, the tokens that start inside it (a token
    that straddles a span's start belongs to the text before it)."""
    encoded = tokenizer(sequence.text, add_special_tokens=False, return_offsets_mapping=True)
    begins = [begin for begin, _ in encoded["offset_mapping"]]  # ascending: the text read left to right
    token_spans = [
        range(bisect_left(begins, start), bisect_left(begins, end)) for start, end in sequence.spans
    ]
    return list(encoded["input_ids"]), token_spans


def span_mask(length: int, token_spans: list[range]) -> list[bool]:
    """A loss mask of `length` tokens, True on the spans' tokens."""
    mask = [False] * length
    for span in token_spans:
        mask[span.start : span.stop] = [True] * len(span)
    return mask
