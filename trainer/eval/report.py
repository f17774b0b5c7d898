"""`dflash-doctor eval`'s text report: the figures, the verdict, and where any output parted."""

from __future__ import annotations

from trainer.eval.compare import TOP_K
from trainer.eval.evaluate import EvalReport, PromptReport


def _rates(path: str, pick: int | None, other: int | None, margin: float | None) -> str:
    if margin is None:
        return f"{path} path has {other} outside its top {TOP_K}"
    return f"{path} path rates {other} {margin:.4g} below {pick}"


def _difference_line(number: int, row: PromptReport) -> str:
    """Where one prompt's outputs part, and how close the target's two choices were there."""
    c = row.comparison
    where = f"  prompt {number}: {c.verdict} at new token index {c.first_diff}"
    if c.greedy_token is None:
        return f"{where}: one output stops early"
    a, b = c.greedy_token, c.spec_token
    allowed = "" if c.allowed_margin is None else f" (a tie allows {c.allowed_margin:.4g})"
    return (
        f"{where}: greedy {a} vs speculative {b}; {_rates('greedy', a, b, c.greedy_margin)}, "
        f"{_rates('speculative', b, a, c.spec_margin)}{allowed}"
    )


def _verdict_line(report: EvalReport) -> str:
    if report.identical:
        return "output tokens identical to target-only greedy decoding (bitwise)"
    ties = (
        f"{report.ties} differ only by a near-tie flip ({report.dtype} rounding between a "
        f"{report.block_size}-token and a 1-token forward, not the drafter; tolerance "
        f"{report.tie_tolerance:g} x max(1, |logit|))"
    )
    if not report.differences:
        return (
            f"output tokens match target-only greedy decoding: {report.prompts - report.ties} bitwise, {ties}"
        )
    return (
        f"output tokens DIFFERENT from target-only greedy decoding in {report.differences} of "
        f"{report.prompts} prompts (a token the target did not choose: a bug)"
    ) + (f"; {ties}" if report.ties else "")


NAMES = {"dflash": "the drafter", "ngram": "prompt lookup"}
# One rule for every forward count printed beside it: each prompt's prefill is a forward (it emits the first token).
FORWARDS_RULE = "each prompt's prefill counted as one forward"


def forwards_compared(mine: int, theirs: int) -> str:
    """`2.40x fewer target forwards (10 vs 24)`, or `2.40x more` when the drafter needed more: never a
    ratio below 1 read as "fewer"."""
    if mine == theirs:
        return f"as many target forwards ({mine})"
    if mine < theirs:
        return f"{theirs / max(mine, 1):.2f}x fewer target forwards ({mine} vs {theirs})"
    return f"{mine / max(theirs, 1):.2f}x more target forwards ({mine} vs {theirs})"


def _proposer_lines(report: EvalReport) -> list[str]:
    """One proposer's figures: tau, forwards, speed, and how deep into a block verification gets."""
    name = NAMES.get(report.drafter, report.drafter)
    by_position = " ".join(f"{i}:{share:.2f}" for i, share in enumerate(report.accept_by_position, 1))
    lengths = " ".join(f"{i}:{count}" for i, count in enumerate(report.accept_length_histogram, 1) if count)
    vllm = (
        f"; {report.mean_accept_len_proposed:.3f} over the forwards that proposed something, as vLLM logs it "
        f"({report.forwards_without_proposal} proposed nothing)"
        if report.forwards_without_proposal and report.mean_accept_len_proposed is not None
        else ""
    )
    return [
        f"{name} ({report.drafter}, block {report.block_size}): mean acceptance length "
        f"{report.mean_accept_len:.3f} tokens per target forward{vllm}",
        f"  target forwards {report.target_forwards} (target-only greedy: {report.baseline_forwards}; "
        f"{FORWARDS_RULE}); "
        f"{report.tok_s:,.1f} tok/s vs {report.baseline_tok_s:,.1f} target-only: speed-up {report.speedup:.2f}x",
        f"  slot accepted (share of forwards): {by_position}",
        f"  tokens emitted per verify forward (count; the prefills left out): {lengths}",
        f"  {_verdict_line(report)}",
    ]


def format_report(report: EvalReport) -> str:
    per_prompt = report.new_tokens / max(report.prompts, 1)
    lines = [
        f"prompts {report.prompts}, new tokens {report.new_tokens} in all ({per_prompt:.1f} a prompt), "
        f"{report.device}, {report.dtype}"
    ]
    lines += _proposer_lines(report)
    lines += [_difference_line(n, r) for n, r in enumerate(report.per_prompt, 1) if not r.identical]
    if report.baseline is not None:
        base = report.baseline
        lines += _proposer_lines(base)
        lines += [_difference_line(n, r) for n, r in enumerate(base.per_prompt, 1) if not r.identical]
        if base.mean_accept_len > 0:
            lines.append(
                f"the drafter against prompt lookup: {report.mean_accept_len / base.mean_accept_len:.2f}x the "
                f"acceptance length, {forwards_compared(report.target_forwards, base.target_forwards)}"
            )
    return "\n".join(lines)
