"""Is a speculative output that differs from target-only greedy a drafter bug, or a rounding near-tie flip?

Greedy block speculative decoding emits, by construction, the target's greedy choice at every position, so
in exact arithmetic its output equals target-only greedy decoding's. In bf16 it need not: the verify forward
(B tokens) and the decode forward (1 token) accumulate their sums in different orders, the logits differ in
their last bits, and where the target's top two logits are nearly tied the argmax can flip. After the first
differing token the two contexts differ, so only that first position can be compared.

Each decode keeps the target's top-k logits at every emitted position (`TopChoices`); `compare_outputs`
looks at the first difference: token a (greedy path) against b (speculative path) is a `tie` when each path
rates the other's token within the tolerance of its own pick, and `different` otherwise (a real bug: the loop
emitted a token the target did not choose). The tolerance is a number of units in the last place of the logit
in the compute dtype (`ulp`): what rounding can move a logit by. The engine's eval checks every token with the
same rule against one forward over the final sequence (trainer.eval.lossless).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from trainer.runspec.eval_request import TIE_ULPS_FP32, TIE_ULPS_LOW_PRECISION

TOP_K = 4  # logits kept per emitted token: a near-tie flip swaps the top two, so 4 leaves room

# Tolerances are in ulps of the top logit (a, the greedy path's pick at the first difference). bf16 keeps 8
# significant bits: an ulp is 2^-7 of the logit's binade, and one rounding moves a value by up to half of one.
# A logit comes out of dozens of layers of sums whose order differs between a B-token verify, a 1-token decode
# step and a whole-sequence forward. Measured on an H100 (BENCHMARKS 5.17): target-only greedy's own tokens lay
# up to 7 bf16 ulps below the top of a whole-sequence forward (4 on HumanEval, 7 on the chat set), so 16 ulps
# (2^-3 of the binade: 6-12% of the logit) is what rounding alone can reach, with room; a token the target did
# not choose (a bug) lies further down. fp16 gets the same count. fp32 (24 bits) order effects stay around 1e-6
# relative, ~8 ulps; 64 keeps clear of them and is still tight (~8e-6 relative).
MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}

Verdict = Literal["identical", "tie", "different"]


def default_tie_ulps(dtype: torch.dtype) -> int:
    """The tolerance the compute dtype's precision justifies (see the constants above)."""
    if dtype in (torch.bfloat16, torch.float16):
        return TIE_ULPS_LOW_PRECISION
    return TIE_ULPS_FP32


def ulp(value: float, dtype: torch.dtype) -> float:
    """One unit in the last place of `value` in `dtype` (the spacing of its binade)."""
    bits = MANTISSA_BITS.get(dtype, 23)
    magnitude = abs(value)
    if not math.isfinite(magnitude) or magnitude < 2.0**-14:  # zero or subnormal: the smallest normal's
        return 2.0 ** (-14 - bits)
    return 2.0 ** (math.floor(math.log2(magnitude)) - bits)


@dataclass(frozen=True)
class TopChoices:
    """The target's k highest logits at one emitted position, highest first."""

    ids: tuple[int, ...]
    logits: tuple[float, ...]

    def logit_of(self, token: int) -> float | None:
        """The token's logit, or None when it is not among the k highest."""
        return self.logits[self.ids.index(token)] if token in self.ids else None


@dataclass(frozen=True)
class Comparison:
    """How one prompt's speculative output compares with target-only greedy's."""

    verdict: Verdict
    first_diff: int | None = None  # index (among the new tokens) of the first differing token
    greedy_token: int | None = None  # a: what target-only greedy emitted there
    spec_token: int | None = None  # b: what speculative decoding emitted there
    greedy_margin: float | None = None  # greedy path: logit(a) - logit(b); None: b not in its top-k
    spec_margin: float | None = None  # speculative path: logit(b) - logit(a); None: a not in its top-k
    allowed_margin: float | None = None  # the tolerance in logits: tie ulps x ulp(logit(a))


def compare_outputs(
    greedy_tokens: list[int],
    greedy_top: list[TopChoices],
    spec_tokens: list[int],
    spec_top: list[TopChoices],
    tie_ulps: int,
    dtype: torch.dtype,
) -> Comparison:
    """Classify the first position where the two outputs differ (`*_top[i]`: the target's view at token i);
    a tie when each path rates the other's token within `tie_ulps` ulps (in `dtype`) of logit(a)."""
    if greedy_tokens == spec_tokens:
        return Comparison("identical")
    at = next(
        (i for i, (a, b) in enumerate(zip(greedy_tokens, spec_tokens, strict=False)) if a != b),
        min(len(greedy_tokens), len(spec_tokens)),
    )
    if at >= len(greedy_tokens) or at >= len(spec_tokens):  # one output stops early: no pair of tokens
        return Comparison("different", first_diff=at)
    a, b = greedy_tokens[at], spec_tokens[at]
    greedy_view, spec_view = greedy_top[at], spec_top[at]
    logit_a = greedy_view.logit_of(a)
    allowed = tie_ulps * ulp(logit_a, dtype) if logit_a is not None else None
    greedy_b, spec_a, spec_b = greedy_view.logit_of(b), spec_view.logit_of(a), spec_view.logit_of(b)
    greedy_margin = logit_a - greedy_b if logit_a is not None and greedy_b is not None else None
    spec_margin = spec_b - spec_a if spec_b is not None and spec_a is not None else None
    tie = (
        allowed is not None
        and greedy_margin is not None
        and spec_margin is not None
        and greedy_margin <= allowed
        and spec_margin <= allowed
    )
    return Comparison("tie" if tie else "different", at, a, b, greedy_margin, spec_margin, allowed)
