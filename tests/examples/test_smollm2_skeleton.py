"""The skeleton rule (examples/smollm2/skeleton.py) that says when two prompts are template twins: numbers,
names and quoted strings masked, case, spacing and the closing mark ignored, the rest of the wording kept."""

from __future__ import annotations

import pytest

from examples.smollm2.skeleton import NAME, NUMBER, QUOTE, Skeletons, skeleton


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("What is 17 + 25?", "What is 3 + 4?"),
        ("What is 17 + 25?", "what   is 3.5 + 1,000"),  # case, spacing, decimals and the closing mark
        (
            "Jessi has 58 marbles. Darryl gives Jessi 2 more. How many marbles does Jessi have now?",
            "Rod has 7 marbles. Piper gives Rod 12 more. How many marbles does Rod have now?",
        ),
        (
            "Write a short postcard to a friend from a weekend trip to San Juan Capistrano.",
            "Write a short postcard to a friend from a weekend trip to Orlando.",
        ),  # a name of three words is one name
        (
            'Explain what the word "allocated" means, and use it in two example sentences.',
            "Explain what the word 'summit' means, and use it in two example sentences.",
        ),
        (
            "Explain what `method_exists` does in PHP, with a short example.",
            "Explain what `chdir` does in Scheme, with a short example.",
        ),
        (
            "Who was the 37th President of the United States?",
            "Who was the 16th President of the United States?",
        ),
    ],
)
def test_the_skeleton_fires_on_template_twins(one: str, other: str) -> None:
    assert skeleton(one) == skeleton(other)


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("What is 17 + 25?", "What is 17 - 25?"),  # marks are wording
        ("What is the capital of France?", "Who wrote Hamlet?"),
        ("Where is Paris?", "What is Paris?"),  # words a sentence opens with are kept
        ("Explain what the word lincoln means.", "Explain what the word summit means."),  # lower case: kept
        ("Describe a vivid and unique character.", "Describe a vivid and unique place."),
        ("Write a persuasive email to a friend.", "Write a persuasive letter to a friend."),
    ],
)
def test_the_skeleton_is_quiet_on_different_sentences(one: str, other: str) -> None:
    assert skeleton(one) != skeleton(other)


def test_the_skeleton_masks_numbers_names_and_quotes_and_keeps_the_rest() -> None:
    assert skeleton("Lilli and Hyo share 214 stickers.") == f"{NAME} and {NAME} share {NUMBER} stickers"
    assert skeleton('What does "www" stand for?') == f"what does {QUOTE} stand for"
    assert skeleton("What’s in “Happy Feet”?") == f"what’s in {QUOTE}"
    # an apostrophe inside a word is not a quote; a contraction that opens a sentence is not a name
    assert skeleton("Don't ask what King's Landing is") == f"don't ask what {NAME} is"
    assert skeleton("Embody Tony Stark from Iron Man") == f"embody {NAME} from {NAME}"
    assert skeleton("H2O in the 1990s!?") == f"{NAME} {NUMBER} {NAME} in the {NUMBER} s"
    assert skeleton("") == "" and skeleton("???") == ""


def test_skeletons_index_answers_twin() -> None:
    index = Skeletons(["What is 3 + 4?", "Who wrote Hamlet?"])
    assert len(index) == 2
    assert index.twin("what is 10 + 20") and index.twin("Who wrote Macbeth?")
    assert not index.twin("What is the capital of France?")
