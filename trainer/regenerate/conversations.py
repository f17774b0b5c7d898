"""Prompt records for regeneration, and the turn-by-turn walk that replaces every assistant turn.

Input lines are JSON objects with either `messages` (a chat; its assistant turns are dropped and generated
again, each from the conversation so far with the target's own earlier answers) or `prompt` (one user turn).
Torch-free: the CLI validates a whole file before any model loads.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.runspec.messages import (
    fields_problem,
    json_problem,
    lone_surrogate,
    messages_problem,
    text_problem,
)

# Issue 38, Q6: the engines take messages only, so a record's tool definitions would be left out of the
# prompt a server renders with them (`tools=` to the template): its answers would be the target's answers
# to another prompt. Refused rather than generated wrong.
TOOLS_REFUSED = (
    '"tools": data regenerate does not render tool definitions (a server passes them to the chat template), '
    'so its answers would not be the ones the target writes with them; drop the line\'s "tools" to answer '
    "without them, or leave the line out (--on-error skip)"
)


class RecordError(ValueError):
    """One input line that cannot be used; `line` is 1-based."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.message = message


@dataclass(frozen=True)
class PromptRecord:
    """One conversation to regenerate: its id (the input's `id`, else `line-N`) and its turns."""

    id: str
    line: int
    messages: tuple[dict[str, str], ...]


def parse_record(line_number: int, text: str) -> PromptRecord:
    """One input line -> PromptRecord, or RecordError naming what is wrong."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(line_number, json_problem(exc, text)) from exc
    except RecursionError as exc:  # was: exit 3 on a line nested 5,000 levels deep
        raise RecordError(
            line_number, "nested too deeply to read (JSON arrays or objects within each other)"
        ) from exc
    if not isinstance(record, dict):
        raise RecordError(line_number, "must be a JSON object")
    raw_id = record.get("id", f"line-{line_number}")
    if not isinstance(raw_id, str | int) or isinstance(raw_id, bool):
        raise RecordError(line_number, '"id" must be a string or an integer')
    odd = lone_surrogate(raw_id, '"id"')
    if odd is not None:  # it is written into --out: it must be text too
        raise RecordError(line_number, f"{odd}: not text")
    both = fields_problem(record, ("messages", "prompt"))
    if both is not None:  # was: "messages" used, "prompt" dropped without a word
        raise RecordError(line_number, both)
    if record.get("tools"):
        raise RecordError(line_number, TOOLS_REFUSED)
    if "messages" in record:
        messages = _checked_messages(line_number, record["messages"])
    elif "prompt" in record:
        problem = text_problem(record["prompt"], '"prompt"')
        if problem is not None:
            raise RecordError(line_number, problem)
        messages = ({"role": "user", "content": record["prompt"]},)
    else:
        raise RecordError(line_number, 'needs "messages" (a chat) or "prompt" (one user turn)')
    return PromptRecord(str(raw_id), line_number, messages)


def _checked_messages(line: int, value: Any) -> tuple[dict[str, str], ...]:
    """The turns of a valid conversation (trainer.runspec.messages' rule), each reduced to role and content."""
    problem = messages_problem(value)
    if problem is not None:
        raise RecordError(line, problem)
    return tuple({"role": m["role"], "content": m.get("content") or ""} for m in value)


def read_records(path: Path) -> Iterator[PromptRecord | RecordError]:
    """Every non-empty line of `path`, in order, parsed; bad lines come out as RecordError (not raised),
    so the caller decides whether to skip or stop."""
    # Read as bytes and decoded line by line: one line that is not UTF-8 is that line's error, named and
    # skippable (issue 58, N9: it refused the whole file, without a line number, --on-error skip or not).
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if number == 1 and raw.startswith(BOM):  # a byte-order mark (Windows editors) is read past
                raw = raw[len(BOM) :]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield RecordError(number, f"not UTF-8 text (byte {exc.start + 1} of the line: {exc.reason})")
                continue
            if not text.strip():
                continue
            try:
                yield parse_record(number, text)
            except RecordError as exc:
                yield exc


BOM = b"\xef\xbb\xbf"


@dataclass
class Regeneration:
    """The walk over one conversation: `prompt()` gives the turns the next answer is generated from (None
    when nothing is left), `answer()` records it. Assistant turns of the input are where answers go; a
    conversation that ends on a user or tool turn gets one more answer at its end."""

    record: PromptRecord
    sample: int = 0  # which of the prompt's sampled answers (--samples-per-prompt)
    turns: list[dict[str, str]] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    generated_tokens: int = 0
    _next: int = 0  # index into record.messages of the next input turn to take
    _waiting: bool = False

    def prompt(self) -> list[dict[str, str]] | None:
        if self._waiting:
            return list(self.turns)
        messages = self.record.messages
        while self._next < len(messages) and messages[self._next]["role"] != "assistant":
            self.turns.append(dict(messages[self._next]))
            self._next += 1
        if self._next < len(messages):  # an assistant turn of the input: generate it anew
            self._next += 1
            self._waiting = True
        elif self.turns and self.turns[-1]["role"] in ("user", "tool"):
            self._waiting = True  # the input ends waiting for an answer
        return list(self.turns) if self._waiting else None

    def answer(self, text: str, finish_reason: str, tokens: int) -> None:
        assert self._waiting, "answer() without a pending prompt()"
        self.turns.append({"role": "assistant", "content": text})
        self.finish_reasons.append(finish_reason)
        self.generated_tokens += tokens
        self._waiting = False

    @property
    def id(self) -> str:
        """The output line's id: the prompt's for sample 0, `<id>#<k>` for sample k."""
        return sample_id(self.record.id, self.sample)

    @property
    def done(self) -> bool:
        return self.prompt() is None


def sample_id(prompt_id: str, sample: int) -> str:
    """Sample 0 keeps the prompt's id (a greedy job's file is what it was); sample k >= 1 is `<id>#<k>`."""
    return prompt_id if sample == 0 else f"{prompt_id}#{sample}"
