"""`dflash-doctor eval`'s text report: the figures, the verdict, and where any output parted."""

from __future__ import annotations

from trainer.decode.compare import TOP_K
from trainer.decode.eval import EvalReport, PromptReport


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


def format_report(report: EvalReport) -> str:
    lines = [
        f"prompts {report.prompts}, new tokens {report.new_tokens}, block {report.block_size}, "
        f"{report.device}, {report.dtype}",
        f"mean acceptance length {report.mean_accept_len:.3f} tokens per target forward",
        f"target forwards {report.target_forwards} (target-only greedy: {report.baseline_forwards})",
        f"{report.tok_s:,.1f} tok/s vs {report.baseline_tok_s:,.1f} tok/s target-only: "
        f"speed-up {report.speedup:.2f}x",
        _verdict_line(report),
    ]
    lines += [_difference_line(n, r) for n, r in enumerate(report.per_prompt, 1) if not r.identical]
    return "\n".join(lines)
