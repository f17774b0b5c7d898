"""Whether an answer ends in a repetition loop, and where to cut it: pure functions, standard library only.

A greedy decoder that falls into a loop repeats one stretch of tokens until the length cap. Such an answer
teaches a drafter that the target repeats itself, which is true only of that answer's tail. An answer "ends
in a loop" when its last tokens are a pattern of period p (1 <= p <= MAX_PERIOD) repeated over at least
MIN_LOOP_TOKENS tokens and at least MIN_REPEATS periods: a 1-token loop needs 48 tokens of it, a 40-token
sentence needs three copies (120 tokens). Code whose lines share a shape but progress (a list of different
numbers, a table of different names) is not periodic token by token, so it does not count; nor does a
short answer, which has no room for 48 repeated tokens.

`ends_in_loop_text` is the same rule over characters for engines that return text only (MIN_LOOP_CHARS,
MAX_PERIOD_CHARS, the same number of periods). `cut_loop` gives the length to truncate a looping answer to:
just after the loop's first full period, so one copy is kept and the repetition is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

MAX_PERIOD = 64
MIN_LOOP_TOKENS = 48
MIN_REPEATS = 3
MAX_PERIOD_CHARS = 256
MIN_LOOP_CHARS = 160

T = TypeVar("T")


def _periodic_tail(items: Sequence[T], period: int) -> int:
    """How many of the last items repeat with this period (items[i] == items[i - period] back from the end),
    the first period of the run included."""
    n = len(items)
    i = n - 1
    while i - period >= 0 and items[i] == items[i - period]:
        i -= 1
    return n - 1 - i + period if n >= period else 0


def loop_of(items: Sequence[T], max_period: int, min_length: int) -> tuple[int, int] | None:
    """(period, length of the repeating tail) of the shortest period whose tail covers both min_length items
    and MIN_REPEATS periods; None when the sequence does not end in a loop."""
    for period in range(1, min(max_period, len(items) // MIN_REPEATS) + 1):
        run = _periodic_tail(items, period)
        if run >= max(min_length, MIN_REPEATS * period):
            return period, run
    return None


def ends_in_loop_text(text: str) -> bool:
    """The same rule over characters, for engines that return text only."""
    return loop_of(text, MAX_PERIOD_CHARS, MIN_LOOP_CHARS) is not None


def cut_loop(token_ids: Sequence[int]) -> int:
    """The length to truncate the answer to: just after the first full period of its final loop (the whole
    length when it does not end in one)."""
    found = loop_of(token_ids, MAX_PERIOD, MIN_LOOP_TOKENS)
    if found is None:
        return len(token_ids)
    period, run = found
    return len(token_ids) - run + period
