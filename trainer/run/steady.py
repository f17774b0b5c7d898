"""Which steps a run's throughput counts: whole pipelined steps only (issue 40).

A step's window runs from the previous step's end to its own. In steady state that window holds this step's
capture (queued ahead by the previous step) and the next step's capture queued behind this step's update,
on the GPU beside it. Some windows are not that: the last step queues no next capture (147 ms against a
211 ms median at qwen3-8b-b16 on an H200), a step followed by an evaluation or a checkpoint queues none
either, and the step after one starts a fresh window with its capture inline. Each metrics line says what
its window was (`window`); the summary counts only `pipelined` windows after the warm-up, and names the
steps it used and the ones it left out, and why.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

# A throughput figure stands only when it agrees with the median step: within this share of the median step's
# tokens / time (a run whose steps drifted, `trainer.run.drift`, does not).
AGREES_WITHIN = 0.05

# The first steps of a run are not its steady state (lazy allocations, the last compiles, caches filling).
WARM_STEPS = 5

PIPELINED = "pipelined"  # a whole pipelined step: the only kind a throughput counts
# Every other kind, with the reason the summary gives for leaving it out.
LEFT_OUT_BECAUSE = {
    "warm-up": "one of the first steps (compiles, allocations, caches filling)",
    "first": "the first step of a launch: no previous step queued its capture",
    "last": "the run's last step: no next capture queued in its window",
    "evaluation": "a held-out evaluation follows it: no next capture queued in its window",
    "checkpoint": "a checkpoint follows it: no next capture queued in its window",
    "after a pause": "after an evaluation or a checkpoint: its capture ran inline in a fresh window",
}


def window_kind(
    step: int, first_of_launch: int, total_steps: int, evaluate: bool, checkpoint: bool, paused: bool
) -> str:
    """What the window of `step` (1-based) was; `paused`: the step before it ended with an evaluation or a
    checkpoint (so this window started at its own start)."""
    if step == total_steps:
        return "last"
    if evaluate:
        return "evaluation"
    if checkpoint:
        return "checkpoint"
    if step == first_of_launch:
        return "first"
    if paused:
        return "after a pause"
    return PIPELINED


def inferred_kinds(records: list[dict[str, Any]], checkpoint_every: int = 0) -> list[str]:
    """The window of each line written before lines said so: the last line, evaluated steps (they carry a
    held-out figure), checkpointed ones (when `checkpoint_every` is known) and the step after either."""
    kinds: list[str] = []
    paused = False
    last = records[-1]["step"] if records else 0
    for r in records:
        step = int(r["step"])
        evaluate = r.get("heldout_accept_len") is not None
        checkpoint = checkpoint_every > 0 and step % checkpoint_every == 0
        kinds.append(window_kind(step, int(records[0]["step"]), last, evaluate, checkpoint, paused))
        paused = evaluate or checkpoint
    return kinds


def ranges(steps: Iterable[int]) -> str:
    """`6-19, 22-38` for 6..19 and 22..38: a step list short enough to print."""
    out: list[str] = []
    ordered = sorted(steps)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ", ".join(out)


def classify(records: list[dict[str, Any]], checkpoint_every: int = 0) -> list[str]:
    """Each line's reason: `pipelined`, `warm-up` or its own window kind (inferred for older lines)."""
    recorded = [r.get("window") for r in records]
    kinds = (
        [str(k) for k in recorded] if records and all(recorded) else inferred_kinds(records, checkpoint_every)
    )
    warm = WARM_STEPS if len(records) >= 2 * WARM_STEPS else min(1, len(records))
    return ["warm-up" if i < warm and k in (PIPELINED, "first") else k for i, k in enumerate(kinds)]


def steady_records(records: list[dict[str, Any]], checkpoint_every: int = 0) -> list[dict[str, Any]]:
    """The lines of the whole pipelined steps after the warm-up: what a throughput counts."""
    kinds = classify(records, checkpoint_every)
    return [r for r, k in zip(records, kinds, strict=True) if k == PIPELINED]


def step_tokens(record: dict[str, Any]) -> float:
    """A line's real tokens; lines written before `tokens` existed give their rate times their time."""
    return float(record.get("tokens") or record["tok_s"] * record["step_time_s"])


def steady_window(records: list[dict[str, Any]], checkpoint_every: int = 0) -> dict[str, Any]:
    """Tokens / seconds over the whole pipelined steps after the warm-up (never a mean of per-step rates),
    the steps used and, per reason, the steps left out."""
    kinds = classify(records, checkpoint_every)
    steady = [r for r, k in zip(records, kinds, strict=True) if k == PIPELINED]
    seconds = sum(r["step_time_s"] for r in steady)
    tokens = sum(map(step_tokens, steady))
    supervised = sum(r.get("supervised_tok_s", 0.0) * r["step_time_s"] for r in steady)
    figure = tokens / seconds if seconds > 0 else None
    median_step = statistics.median(r["step_time_s"] for r in steady) if steady else None
    median_tokens = statistics.median(map(step_tokens, steady)) if steady else 0
    median_tok_s = median_tokens / median_step if median_step else None
    left_out: dict[str, str] = {}
    for reason in LEFT_OUT_BECAUSE:
        steps = [int(r["step"]) for r, k in zip(records, kinds, strict=True) if k == reason]
        if steps:
            left_out[reason] = ranges(steps)
    return {
        "steady_tok_s": figure,
        "steady_supervised_tok_s": supervised / seconds if seconds > 0 else None,
        "steady_steps": [steady[0]["step"], steady[-1]["step"]] if steady else None,
        "steady_step_count": len(steady),
        "steady_used": ranges(int(r["step"]) for r in steady),
        "steady_left_out": left_out,
        "steady_seconds": seconds,
        "median_step_s": median_step,
        "median_tok_s": median_tok_s,  # the median step's tokens / its time: what the figure must agree with
        "agrees_with_median": (
            abs(figure / median_tok_s - 1) <= AGREES_WITHIN if figure is not None and median_tok_s else None
        ),
    }
