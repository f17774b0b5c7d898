"""`dflash-doctor eval`'s text report: tau beside prompt lookup's (per kind where the prompts file names kinds),
the wall-clock speed-up at each batch, every token checked, and where any output parted from target-only greedy."""

from __future__ import annotations

from trainer.eval.compare import TOP_K
from trainer.eval.figures import EvalReport, GroupRow, LatencyRow, PromptReport
from trainer.eval.lossless import TokenCheck

NAMES = {"dflash": "the drafter", "ngram": "prompt lookup", "target": "target-only greedy"}
# One rule for every forward count printed beside it: each prompt's prefill is a forward (it emits the first token).
FORWARDS_RULE = "each prompt's prefill counted as one forward"


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
        f"{report.block_size}-token and a 1-token forward, not the drafter; tolerance {report.tie_ulps} ulps "
        "of the top logit)"
    )
    if not report.differences:
        return (
            f"output tokens match target-only greedy decoding: {report.prompts - report.ties} bitwise, {ties}"
        )
    return (
        f"output tokens DIFFERENT from target-only greedy decoding in {report.differences} of "
        f"{report.prompts} prompts (a token the target did not choose: a bug)"
    ) + (f"; {ties}" if report.ties else "")


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
    at_once = "one prompt at a time" if report.engine == "loop" else f"{report.rows_at_once} rows at once"
    return [
        f"{name} ({report.drafter}, block {report.block_size}): mean acceptance length "
        f"{report.mean_accept_len:.3f} tokens per target forward{vllm}",
        f"  target forwards {report.target_forwards} (target-only greedy: {report.baseline_forwards}; "
        f"{FORWARDS_RULE}); {report.tok_s:,.1f} tok/s vs {report.baseline_tok_s:,.1f} target-only "
        f"({at_once}): speed-up {report.speedup:.2f}x",
        f"  slot accepted (share of forwards): {by_position}",
        f"  tokens emitted per verify forward (count; the prefills left out): {lengths}",
        f"  {_verdict_line(report)}",
    ]


def _check_line(check: TokenCheck) -> str:
    worst = f" (the farthest {check.worst_ulps:g} ulps)" if check.near_ties else ""
    line = (
        f"  {NAMES.get(check.drafter, check.drafter)}: {check.checked:,} tokens, {check.exact:,} the target's "
        f"top choice, {check.near_ties:,} near-ties{worst}, {check.off:,} off"
    )
    if check.off_at:
        where = "; ".join(f"prompt {o['prompt'] + 1} token {o['index']}" for o in check.off_at[:3])
        line += f" ({where})"
    return line


def _lossless_lines(report: EvalReport) -> list[str]:
    checks = [r.lossless for r in (report, report.baseline) if r is not None and r.lossless is not None]
    if not checks:
        return []
    lines = [
        f"every token checked against one target forward over its final sequence (a near-tie: within "
        f"{checks[0].tolerance_ulps} {checks[0].dtype} ulps of the top logit):"
    ]
    lines += [_check_line(c) for c in checks]
    if report.target_lossless is not None:
        lines.append(_check_line(report.target_lossless) + " (rounding alone, no drafter)")
    return lines


def _group_lines(groups: list[GroupRow]) -> list[str]:
    if not groups:
        return []
    lines = ["tau per group of the prompts file (prompt lookup's beside it):"]
    for g in groups:
        name = g.group.removeprefix("kind:")
        base = f" vs {g.baseline_tau:.2f} ({g.ratio:.2f}x)" if g.baseline_tau and g.ratio else ""
        lines.append(f"  {name:<14} {g.prompts:>4} prompts  {g.tau:.2f}{base}")
    return lines


def _latency_lines(rows: list[LatencyRow]) -> list[str]:
    if not rows:
        return []
    ways = list(dict.fromkeys(r.drafter for r in rows))
    requests = rows[0].requests
    lines = [
        f"wall clock: generated tok/s with a batch of requests in flight ({requests} requests, after a warm-up; "
        "speed-up over target-only greedy at that batch):",
        "  batch  " + "".join(f"{NAMES.get(w, w):>22}" for w in ways),
    ]
    for batch in dict.fromkeys(r.batch for r in rows):
        cells = []
        for way in ways:
            row = next(r for r in rows if r.batch == batch and r.drafter == way)
            cells.append(f"{row.tok_s:,.1f}" + ("" if way == "target" else f" ({row.speedup:.2f}x)"))
        lines.append(f"  {batch:>5}  " + "".join(f"{c:>22}" for c in cells))
    return lines


def format_report(report: EvalReport) -> str:
    per_prompt = report.new_tokens / max(report.prompts, 1)
    engine = "the KV engine" if report.engine == "kv" else "the Python loop, one prompt at a time"
    timing = f" · {report.seconds:.1f} s" if report.seconds else ""
    if report.decode_seconds:
        timing += f" (decoding the set every way: {report.decode_seconds:.1f} s)"
    lines = [
        f"prompts {report.prompts}, new tokens {report.new_tokens} in all ({per_prompt:.1f} a prompt, at most "
        f"{report.max_new_tokens}), {report.device}, {report.dtype}, {engine}{timing}"
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
    lines += _group_lines(report.groups)
    lines += _lossless_lines(report)
    lines += _latency_lines(report.latency)
    return "\n".join(lines)
