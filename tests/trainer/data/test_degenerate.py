"""trainer/data/degenerate.py: answers that end in a repetition loop are found (1-token loops, multi-line
code loops, a long sentence repeated), normal ones are not (prose, progressing code, short answers), and
`cut_loop` keeps one period of the loop."""

from __future__ import annotations

import random

import pytest

from trainer.data.degenerate import (
    MAX_PERIOD,
    MIN_LOOP_TOKENS,
    cut_loop,
    ends_in_loop_text,
    loop_of,
)


def ends_in_loop(token_ids: list[int]) -> bool:
    """The token rule (the module docstring says what counts), as `cut_loop` and the data's loop counts apply it."""
    return loop_of(token_ids, MAX_PERIOD, MIN_LOOP_TOKENS) is not None


PROSE = (
    "Photosynthesis is how plants turn light into food. In the leaves, chlorophyll absorbs sunlight, and the "
    "plant uses that energy to combine carbon dioxide from the air with water drawn up from the roots. The "
    "result is glucose, which the plant burns or stores as starch, and oxygen, which it releases. Without it "
    "there would be almost no oxygen in the atmosphere and no food chain on land as we know it."
)
PROGRESSING_CODE = (
    "primes = [\n" + "".join(f"    {p},\n" for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)) + "]\n"
)
CODE_LOOP_BLOCK = "    if x > 0:\n        return x\n    else:\n        return -x\n"


def _words(text: str) -> list[int]:
    """A stand-in tokenizer: one id per distinct word (enough to make the token patterns of a text)."""
    vocab: dict[str, int] = {}
    return [vocab.setdefault(w, len(vocab)) for w in text.replace("\n", " \n ").split(" ") if w]


def _random_ids(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(49152) for _ in range(n)]


def test_a_one_token_loop_fires_once_it_covers_48_tokens() -> None:
    head = _random_ids(30)
    assert ends_in_loop(head + [7] * MIN_LOOP_TOKENS)
    assert not ends_in_loop(head + [7] * (MIN_LOOP_TOKENS - 2))  # 47 repeated tokens: not yet


def test_a_multi_line_code_loop_fires_and_its_cut_keeps_one_copy() -> None:
    head = _random_ids(40, seed=1)
    block = _random_ids(23, seed=2)  # a 4-line block of code, 23 tokens
    answer = head + block * 5
    assert ends_in_loop(answer) and loop_of(answer, 64, MIN_LOOP_TOKENS) == (23, 115)
    assert cut_loop(answer) == len(head) + len(block)
    text = "def sign(x):\n" + CODE_LOOP_BLOCK * 4
    assert ends_in_loop_text(text)


def test_a_long_sentence_repeated_fires_only_from_three_copies() -> None:
    sentence = _random_ids(40, seed=3)
    head = _random_ids(25, seed=4)
    assert ends_in_loop(head + sentence * 3)
    assert not ends_in_loop(head + sentence * 2)  # 80 tokens, but only two periods
    long = " The committee will review the proposal again at the next meeting of the board."
    assert ends_in_loop_text("Summary:" + long * 3) and not ends_in_loop_text("Summary:" + long * 2)


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(PROSE, id="prose"),
        pytest.param(PROGRESSING_CODE, id="a-list-of-different-numbers"),
        pytest.param("The answer is 42.", id="short"),
        pytest.param("", id="empty"),
    ],
)
def test_normal_answers_stay_quiet(answer: str) -> None:
    assert not ends_in_loop(_words(answer))
    assert not ends_in_loop_text(answer)
    assert cut_loop(_words(answer)) == len(_words(answer))


def test_progressing_tokens_with_a_repeated_shape_stay_quiet() -> None:
    """`    n,\\n` lines: the indent, comma and newline tokens repeat every 4 tokens, the number does not."""
    ids = []
    for n in range(100):
        ids += [9, 1000 + n, 11, 12]
    assert not ends_in_loop(ids)


def test_the_shortest_period_is_reported_and_cut_is_the_whole_answer_when_there_is_no_loop() -> None:
    ids = _random_ids(10) + [1, 2] * 40
    assert loop_of(ids, 64, MIN_LOOP_TOKENS) == (2, 80)
    assert cut_loop(ids) == 12
    assert cut_loop(_random_ids(200)) == 200
