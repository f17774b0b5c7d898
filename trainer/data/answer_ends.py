"""What the target did not write at an answer's end: left out of the loss.

Two cases, both read from what `data regenerate` records (`generation.finish_reasons`, one per assistant
message) and the answer's own tokens:

- An answer cut at `--max-new-tokens` ("length") did not end its turn: the template still renders an
  end-of-turn token after it, which the target never chose there. That token is not supervised (a drafter
  taught it learns to stop where the target goes on).
- `data.loops = "cut"`: an answer that ends in a repetition loop (`trainer.data.degenerate`) is supervised
  up to the loop's first full period; the repeats and the end-of-turn token after them are not. `"drop"`:
  no token of such an answer is supervised. Either way the tokens stay in the sequence as context (a later
  answer was generated after them). "keep" (the default) trains on the whole answer: the target did write it.

Held-out answers go through the same source, so they are scored as they are trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainer.data.degenerate import cut_loop

LOOP_MODES = ("keep", "cut", "drop")


@dataclass
class AnswerEnds:
    """Counts over the answers of one or more sequences (`data preview` sums them)."""

    unfinished: int = 0  # answers cut at the length cap: the end-of-turn token after them not supervised
    loops_cut: int = 0  # answers whose repeating tail is not supervised (data.loops = "cut")
    loops_dropped: int = 0  # looping answers not supervised at all (data.loops = "drop")
    tokens_left_out: int = 0  # supervised tokens these two rules took out of the loss

    def add(self, other: AnswerEnds) -> None:
        self.unfinished += other.unfinished
        self.loops_cut += other.loops_cut
        self.loops_dropped += other.loops_dropped
        self.tokens_left_out += other.tokens_left_out


def finish_reasons(record: dict[str, Any], answers: int) -> list[str] | None:
    """The record's finish reason per assistant message (`data regenerate`'s `generation.finish_reasons`),
    or None where it has none, or a list that does not match its assistant messages (then nothing is
    assumed: every end-of-turn token stays supervised)."""
    generation = record.get("generation")
    reasons = generation.get("finish_reasons") if isinstance(generation, dict) else None
    if not isinstance(reasons, list) or len(reasons) != answers:
        return None
    if not all(isinstance(r, str) for r in reasons):
        return None
    return reasons


def trim_answer_ends(
    ids: Sequence[int],
    mask: list[bool],
    token_spans: Sequence[range],
    span_answers: Sequence[int],
    reasons: Sequence[str] | None,
    loops: str,
) -> AnswerEnds:
    """Take out of `mask` (in place) what the target did not write at each supervised answer's end.

    `token_spans[i]` are the tokens of a supervised answer, its end-of-turn token last; `span_answers[i]` which
    assistant message it is (an index into `reasons`)."""
    if loops not in LOOP_MODES:
        raise ValueError(f"loops must be one of {LOOP_MODES}, got {loops!r}")
    ends = AnswerEnds()
    for span, answer in zip(token_spans, span_answers, strict=True):
        if len(span) < 2:
            continue
        content = span[:-1]  # the answer's tokens, its end-of-turn token apart
        unfinished = reasons is not None and reasons[answer] == "length"
        ends.unfinished += unfinished
        left_out = span[-1:] if unfinished else range(0)
        if loops != "keep" and (keep := cut_loop([ids[i] for i in content])) < len(content):
            if loops == "cut":
                left_out = span[keep:]  # the end-of-turn token with the repeats
                ends.loops_cut += 1
            else:
                left_out = span  # the whole answer, its end-of-turn token too
                ends.loops_dropped += 1
        for i in left_out:
            ends.tokens_left_out += int(mask[i])
            mask[i] = False
    return ends
