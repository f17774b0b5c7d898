"""`eval`'s figures: what one way of proposing (the drafter, prompt lookup) did over every prompt, against
target-only greedy decoding, built the same way whichever decoder ran (the engine, or the Python loop).

Counting, one rule for both: tau (`mean_accept_len`) is emitted tokens per verify forward, the bonus token
included, over every verify forward (one that proposed nothing emits one token); each prompt's prefill emits
its first token and is counted as a target forward but not as a verify forward. Tokens accepted past the
budget or an end-of-turn are not counted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from trainer.eval.compare import Comparison
from trainer.eval.lossless import TokenCheck


@dataclass
class Walk:
    """One prompt decoded one way."""

    tokens: list[int]
    forwards: int = 0  # verify forwards (0: target-only greedy)
    drafted: int = 0  # verify forwards whose proposal had at least one token
    emitted: list[int] = field(default_factory=list)  # [n - 1]: verify forwards that emitted n tokens
    seconds: float | None = None  # its own wall time (the Python loop); None where prompts share steps

    @property
    def emitted_tokens(self) -> int:
        return sum((n + 1) * count for n, count in enumerate(self.emitted))


def walk_of_lengths(
    tokens: list[int], accepted: list[int], proposed: list[int], block: int, seconds: float | None
) -> Walk:
    """A Walk from per-forward acceptance lengths (the Python loop's `Decoded.accepted` / `.proposed`)."""
    histogram = [sum(a == n for a in accepted) for n in range(1, block + 1)]
    return Walk(tokens, len(accepted), sum(1 for n in proposed if n), histogram, seconds)


@dataclass
class PromptReport:
    prompt_tokens: int
    new_tokens: int
    identical: bool  # the output == target-only greedy's, token for token (bitwise)
    accept_len: float
    target_forwards: int
    baseline_forwards: int
    seconds: (
        float | None
    )  # this prompt's own decode (the Python loop; None on the engine: prompts share steps)
    baseline_seconds: float | None
    comparison: Comparison  # identical, a near-tie flip (tie) or a real difference; where and by how much
    kind: str | None = None  # the prompts file's "kind"


@dataclass
class LatencyRow:
    """Generated tokens per second with `batch` requests in flight, one way of decoding (issue 56)."""

    batch: int
    drafter: str  # target (target-only greedy) | dflash | ngram
    tok_s: float
    speedup: float  # over target-only greedy at the same batch
    requests: int
    new_tokens: int
    seconds: float
    tau: float | None  # emitted per verify forward in this run (None: target-only)
    ms_per_step: float = 0.0  # a decode step's wall time (a verify forward with its drafting), prefills apart


@dataclass
class GroupRow:
    """tau over the prompts of one group the prompts file names (a kind; template twins or not)."""

    group: str
    prompts: int
    tau: float
    baseline_tau: float | None  # prompt lookup's on the same prompts
    ratio: float | None


@dataclass
class EvalReport:
    """One proposer (the drafter, or prompt lookup) over every prompt, against target-only greedy decoding."""

    prompts: int
    mean_accept_len: float  # tau: emitted tokens per verify forward (bonus token included), over all forwards
    target_forwards: int
    baseline_forwards: int  # target-only greedy: one forward per token
    new_tokens: int
    tok_s: float
    baseline_tok_s: float
    speedup: float
    identical: bool  # every prompt's output bitwise identical to target-only greedy's
    ties: int  # prompts whose outputs differ only by a near-tie flip (rounding, not the drafter)
    differences: int  # prompts whose outputs really differ (a bug)
    tie_ulps: int  # near-tie tolerance: ulps of the top logit, in the compute dtype
    dtype: str
    block_size: int  # tokens a verify forward checks at most: the proposal + the last accepted token
    device: str
    per_prompt: list[PromptReport]
    drafter: str = "dflash"  # dflash | ngram (prompt lookup)
    # How far into a block verification gets: [i] = the share of verify forwards that accepted slot i + 1
    # (what a block size and a draft depth are chosen with), and how many forwards emitted 1, 2, ... B tokens.
    accept_by_position: list[float] = field(default_factory=list)
    accept_length_histogram: list[int] = field(default_factory=list)
    baseline: EvalReport | None = None  # prompt lookup on the same prompts and target, when asked for
    # The figure as vLLM logs it ("Mean acceptance length": 1 + accepted / drafts, a draft counted only when
    # it proposed a token): tau over the verify forwards that proposed something; None when none did. Equal
    # to tau for the drafter (it always proposes); above it for prompt lookup, whose empty proposals tau counts.
    mean_accept_len_proposed: float | None = None
    forwards_without_proposal: int = 0  # verify forwards that proposed nothing (one plain decoding step each)
    engine: str = "loop"  # kv (batched, static cache, graphs) | loop (one prompt at a time, Python)
    max_new_tokens: int = 0
    rows_at_once: int = 1  # slots of the run tok_s and speedup come from (the loop: 1)
    lossless: TokenCheck | None = None  # every emitted token against one forward over its final sequence
    target_lossless: TokenCheck | None = None  # the same check of target-only greedy's own tokens
    groups: list[GroupRow] = field(default_factory=list)  # per kind / twin group the prompts file names
    latency: list[LatencyRow] = field(default_factory=list)  # per batch and way of decoding (issue 56)
    seconds: float = 0.0  # the whole eval's wall time, loading included
    decode_seconds: float = 0.0  # of which decoding the whole set every way (tau; the latency rows apart)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def exit_code(self, strict: bool = False) -> int:
        """1 on a real difference or a token off the target's choice (or, `strict`, on anything not bitwise
        identical, near-ties included), else 0; the baseline goes through the same loop, so a difference
        there is the same bug."""
        off = self.lossless is not None and self.lossless.off > 0
        own = 1 if self.differences or off or (strict and not self.identical) else 0
        return max(own, self.baseline.exit_code(strict) if self.baseline is not None else 0)


def acceptance_shape(histogram: list[int]) -> list[float]:
    """The share of verify forwards accepting each slot 1..B-1, from how many emitted 1..B tokens."""
    forwards = max(sum(histogram), 1)
    block = len(histogram)
    return [round(sum(histogram[slot:]) / forwards, 4) for slot in range(1, block)]


def tau_of(walks: list[Walk]) -> float:
    forwards = sum(w.forwards for w in walks)
    return sum(w.emitted_tokens for w in walks) / forwards if forwards else 0.0


def proposer_report(
    name: str,
    block: int,
    prompts: list[list[int]],
    walks: list[Walk],
    greedy: list[Walk],
    comparisons: list[Comparison],
    rates: tuple[float, float],
    context: dict[str, Any],
) -> EvalReport:
    """The figures of one way of proposing over every prompt (`greedy`: target-only's walks of the same
    prompts; `rates`: its and target-only's generated tok/s; `context`: the fields every report shares)."""
    rows = [
        PromptReport(
            prompt_tokens=len(prompt),
            new_tokens=len(walk.tokens),
            identical=walk.tokens == base.tokens,
            accept_len=walk.emitted_tokens / walk.forwards if walk.forwards else 0.0,
            target_forwards=1 + walk.forwards,
            baseline_forwards=len(base.tokens),
            seconds=walk.seconds,
            baseline_seconds=base.seconds,
            comparison=comparison,
        )
        for prompt, walk, base, comparison in zip(prompts, walks, greedy, comparisons, strict=True)
    ]
    histogram = [sum(w.emitted[n] for w in walks if len(w.emitted) > n) for n in range(block)]
    forwards = sum(w.forwards for w in walks)
    drafted = sum(w.drafted for w in walks)
    emitted = sum(w.emitted_tokens for w in walks)
    tok_s, baseline_tok_s = rates
    return EvalReport(
        prompts=len(prompts),
        mean_accept_len=emitted / forwards if forwards else 0.0,
        target_forwards=sum(r.target_forwards for r in rows),
        baseline_forwards=sum(r.baseline_forwards for r in rows),
        new_tokens=sum(r.new_tokens for r in rows),
        tok_s=tok_s,
        baseline_tok_s=baseline_tok_s,
        speedup=tok_s / baseline_tok_s if baseline_tok_s else 0.0,
        identical=all(r.identical for r in rows),
        ties=sum(r.comparison.verdict == "tie" for r in rows),
        differences=sum(r.comparison.verdict == "different" for r in rows),
        block_size=block,
        per_prompt=rows,
        drafter=name,
        accept_by_position=acceptance_shape(histogram),
        accept_length_histogram=histogram,
        # a forward that proposed nothing emits one token: what the drafted ones emitted is the rest
        mean_accept_len_proposed=(emitted - (forwards - drafted)) / drafted if drafted else None,
        forwards_without_proposal=forwards - drafted,
        **context,
    )
