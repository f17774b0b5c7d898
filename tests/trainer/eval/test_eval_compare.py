"""`trainer.eval.compare`: a near-tie flip is a `tie`, a token the target did not choose is `different`; the
tolerance is a number of ulps of the top logit in the compute dtype."""

from __future__ import annotations

import pytest
import torch

from trainer.eval.compare import TopChoices, compare_outputs, default_tie_ulps, ulp
from trainer.runspec.eval_request import TIE_ULPS_FP32, TIE_ULPS_LOW_PRECISION

BF16 = torch.bfloat16


def top(**logits: float) -> TopChoices:
    """TopChoices from t<id>=logit pairs, sorted highest first as torch.topk gives them."""
    pairs = sorted(((int(name[1:]), value) for name, value in logits.items()), key=lambda p: -p[1])
    return TopChoices(tuple(i for i, _ in pairs), tuple(v for _, v in pairs))


SAME = top(t7=9.0, t8=3.0, t9=2.0, t10=1.0)  # a position both decodes agree on


def test_an_ulp_is_the_spacing_of_the_values_binade() -> None:
    assert ulp(5.0, BF16) == 2**-5  # [4, 8): 8 significant bits, 2^2 / 2^7
    assert ulp(-20.0, BF16) == 2**-3 and ulp(1.0, BF16) == 2**-7
    assert ulp(5.0, torch.float32) == 2**-21
    assert ulp(0.0, BF16) == 2.0 ** (-14 - 7)  # no zero-width tolerance at a zero logit
    # what torch itself rounds to: the next bf16 after 5.0 is 5.0 + one ulp
    assert torch.tensor(5.0 + ulp(5.0, BF16), dtype=BF16).item() == 5.03125


def test_identical_outputs_are_identical_with_no_position() -> None:
    result = compare_outputs([7, 7], [SAME, SAME], [7, 7], [SAME, SAME], TIE_ULPS_FP32, torch.float32)
    assert result.verdict == "identical" and result.first_diff is None


def test_a_flipped_near_tie_is_a_tie_with_both_margins() -> None:
    greedy_view = top(t1=5.0, t2=4.99, t3=1.0, t4=0.5)  # greedy picks 1, rates 2 0.01 below
    spec_view = top(t2=5.0, t1=4.995, t3=1.0, t4=0.5)  # verify picks 2, rates 1 0.005 below
    result = compare_outputs(
        [7, 1, 9], [SAME, greedy_view, SAME], [7, 2, 4], [SAME, spec_view, SAME], 8, BF16
    )
    assert result.verdict == "tie" and result.first_diff == 1
    assert (result.greedy_token, result.spec_token) == (1, 2)
    assert result.greedy_margin == pytest.approx(0.01) and result.spec_margin == pytest.approx(0.005)
    assert result.allowed_margin == pytest.approx(8 * 2**-5)  # 8 bf16 ulps at logit(a) = 5


def test_a_margin_past_the_tolerance_on_either_side_is_different() -> None:
    close = top(t1=5.0, t2=4.99, t3=1.0, t4=0.5)
    far = top(t2=5.0, t1=4.0, t3=1.0, t4=0.5)  # the verify forward rates 1 a whole logit below
    result = compare_outputs([1], [close], [2], [far], 8, BF16)
    assert result.verdict == "different" and result.spec_margin == pytest.approx(1.0)
    result = compare_outputs([1], [top(t1=5.0, t2=4.0, t3=1.0)], [2], [top(t2=5.0, t1=4.99)], 8, BF16)
    assert result.verdict == "different" and result.greedy_margin == pytest.approx(1.0)


def test_a_token_outside_the_greedy_top_k_is_different_with_no_margin() -> None:
    greedy_view = top(t1=5.0, t3=4.0, t4=3.0, t5=2.0)  # 2 is not among the greedy path's best four
    spec_view = top(t2=6.0, t1=5.0, t3=4.0, t4=3.0)
    result = compare_outputs([1], [greedy_view], [2], [spec_view], 1 << 10, BF16)
    assert result.verdict == "different"
    assert result.greedy_margin is None and result.spec_margin == pytest.approx(1.0)


def test_the_tolerance_scales_with_the_logits_binade() -> None:
    big = compare_outputs([1], [top(t1=100.0, t2=97.0)], [2], [top(t2=100.0, t1=97.0)], 8, BF16)
    assert big.verdict == "tie" and big.allowed_margin == pytest.approx(8 * 2**-1)  # [64, 128): ulp 0.5
    small = compare_outputs([1], [top(t1=0.2, t2=0.17)], [2], [top(t2=0.2, t1=0.17)], 8, BF16)
    assert small.verdict == "different" and small.allowed_margin == pytest.approx(8 * 2**-10)
    exact_only = compare_outputs([1], [top(t1=0.2, t2=0.17)], [2], [top(t2=0.2, t1=0.17)], 0, BF16)
    assert exact_only.verdict == "different"


def test_an_output_that_stops_early_is_different() -> None:
    result = compare_outputs([7, 7], [SAME, SAME], [7], [SAME], TIE_ULPS_FP32, torch.float32)
    assert result.verdict == "different" and result.first_diff == 1 and result.greedy_token is None


def test_the_default_tolerance_follows_the_compute_dtype() -> None:
    assert default_tie_ulps(torch.bfloat16) == TIE_ULPS_LOW_PRECISION == 16
    assert default_tie_ulps(torch.float16) == TIE_ULPS_LOW_PRECISION
    assert default_tie_ulps(torch.float32) == TIE_ULPS_FP32 == 64
