"""`eval`'s wording (trainer/decode/report.py): comparisons that read right both ways, labels that say what
a figure counts."""

from __future__ import annotations

from trainer.eval.report import forwards_compared


def test_a_drafter_that_needed_more_forwards_is_said_to_need_more_not_fewer() -> None:
    """It printed "0.42x fewer target forwards" when the drafter needed 2.4x more."""
    assert forwards_compared(24, 10) == "2.40x more target forwards (24 vs 10)"
    assert forwards_compared(10, 24) == "2.40x fewer target forwards (10 vs 24)"
    assert forwards_compared(7, 7) == "as many target forwards (7)"


def test_the_report_labels_new_tokens_as_a_total_and_states_how_forwards_are_counted() -> None:
    """`new tokens 24` beside `--max-new-tokens 8` read as a per-prompt figure; the forwards figure counted
    the prefills and the histogram did not, without a word."""
    from tests.trainer.eval.test_eval import PROMPTS, _tiny_target, _untrained_drafter
    from trainer.eval.evaluate import evaluate
    from trainer.eval.report import format_report

    text = format_report(evaluate(_tiny_target(), _untrained_drafter(), PROMPTS, max_new=8))
    assert "prompts 3, new tokens 24 in all (8.0 a prompt, at most 8)" in text
    assert "each prompt's prefill counted as one forward" in text
    assert "tokens emitted per verify forward (count; the prefills left out)" in text
