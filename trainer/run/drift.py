"""Did a run's steady steps slow down (or speed up) as it went, and what changed with them.

A throughput figure is tokens / seconds over the steady steps (`trainer.run.steady`); it agrees with the median
step only when the steps kept their pace. S14's SmolLM2 run on one H200 did not (118 ms a step up to step
~2,250, 167-199 ms after, the same ~10k tokens a step): its 67.1k tok/s and the median's 75.9k were 12% apart,
and nothing in the run said why. This compares the first and last thirds of the steady steps: their median
step times, and beside them every reading that could explain a change (tokens a step, data wait, and the
machine's samples: the GPU's clock and slowdowns, this process's CPU time, the host's steal), and says in
one line what changed with the steps.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from typing import Any

from trainer.run.steady import ranges, steady_records

DRIFT = 0.10  # a change of a tenth or more in the median step time is named
MIN_STEPS = 30  # fewer steady steps than this: thirds too short to compare
Reading = Callable[[dict[str, Any]], float | None]


def machine_value(name: str) -> Reading:
    """One number of a line's machine sample (`trainer.run.telemetry`), None where it was not read."""

    def read(record: dict[str, Any]) -> float | None:
        value = (record.get("machine") or {}).get(name)
        return float(value) if isinstance(value, int | float) else None

    return read


READINGS: dict[str, Reading] = {
    "step_s": lambda r: float(r["step_time_s"]),
    "tokens": lambda r: float(r["tokens"]) if r.get("tokens") else None,
    "data_wait_s": lambda r: float(r["data_wait_s"]) if r.get("data_wait_s") is not None else None,
    "sm_mhz": machine_value("sm_mhz"),
    "gpu_w": machine_value("gpu_w"),
    "gpu_c": machine_value("gpu_c"),
    "proc_cpu_s": machine_value("proc_cpu_s"),
    "cpu_steal": machine_value("cpu_steal"),
}


def median_of(records: list[dict[str, Any]], read: Reading) -> float | None:
    values = [v for v in map(read, records) if v is not None]
    return statistics.median(values) if values else None


def step_drift(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first and last thirds of the steady steps side by side, and `finding`: one line when the median
    step changed by DRIFT or more (else None). None when there are too few steady steps to compare."""
    steady = steady_records(records)
    if len(steady) < MIN_STEPS:
        return None
    third = len(steady) // 3
    early, late = steady[:third], steady[-third:]
    medians = {name: (median_of(early, read), median_of(late, read)) for name, read in READINGS.items()}
    before, after = medians["step_s"]
    assert before is not None and after is not None  # every line has a step time
    change = after / before - 1 if before > 0 else 0.0
    early_steps = ranges(int(r["step"]) for r in early)
    late_steps = ranges(int(r["step"]) for r in late)
    finding = None
    if abs(change) >= DRIFT:
        word = "longer" if change > 0 else "shorter"
        first, last = f"{early[0]['step']}-{early[-1]['step']}", f"{late[0]['step']}-{late[-1]['step']}"
        finding = (
            f"the steady steps drifted: steps {last} took {abs(change):.0%} {word} than steps {first} "
            f"(median {after * 1000:.1f} ms against {before * 1000:.1f} ms); "
            + "; ".join(explanations(medians, early, late))
        )
    return {
        "early_steps": early_steps,
        "late_steps": late_steps,
        "change": round(change, 4),
        "medians": {k: [rounded(v) for v in pair] for k, pair in medians.items() if pair != (None, None)},
        "finding": finding,
    }


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def known(pair: tuple[float | None, float | None]) -> tuple[float, float] | None:
    """Both medians, when both halves had the reading and the first is positive."""
    before, after = pair
    return (before, after) if before is not None and after is not None and before > 0 else None


def grew(pair: tuple[float | None, float | None], by: float) -> tuple[float, float, float] | None:
    """(first, second, relative change) when both are known and the change is at least `by` either way."""
    values = known(pair)
    if values is None or abs(values[1] / values[0] - 1) < by:
        return None
    return values[0], values[1], values[1] / values[0] - 1


def explanations(
    medians: dict[str, tuple[float | None, float | None]],
    early: list[dict[str, Any]],
    late: list[dict[str, Any]],
) -> list[str]:
    """What changed beside the step time, most telling first; a line that says nothing sampled did, if so."""
    said: list[str] = []
    if (tokens := grew(medians["tokens"], DRIFT / 2)) is not None:
        said.append(f"the steps held {abs(tokens[2]):.0%} {'more' if tokens[2] > 0 else 'fewer'} tokens")
    if (clock := grew(medians["sm_mhz"], 0.05)) is not None:
        seen = Counter(name for r in late for name in (r.get("machine") or {}).get("gpu_slowdown") or [])
        why = f" ({', '.join(name for name, _ in seen.most_common())} reported)" if seen else ""
        said.append(f"the GPU's SM clock went from {clock[0]:.0f} to {clock[1]:.0f} MHz{why}")
    before, after = medians["cpu_steal"]
    if before is not None and after is not None and after - before >= 0.03:
        said.append(f"other guests of the host took {after:.0%} of its CPU time (steal), from {before:.0%}")
    if (cpu := grew(medians["proc_cpu_s"], DRIFT)) is not None:
        why = "more work on the host, or slower or shared cores" if cpu[2] > 0 else "less work on the host"
        said.append(
            f"this process's CPU time a step went from {cpu[0] * 1000:.1f} to {cpu[1] * 1000:.1f} ms ({why})"
        )
    if (power := grew(medians["gpu_w"], DRIFT)) is not None:
        busier = "busier" if power[2] > 0 else "idler"
        said.append(f"the GPU drew {power[1]:.0f} W against {power[0]:.0f} W ({busier})")
    if (wait := grew(medians["data_wait_s"], DRIFT)) is not None and abs(wait[1] - wait[0]) >= 0.002:
        said.append(f"waiting for data went from {wait[0] * 1000:.1f} to {wait[1] * 1000:.1f} ms a step")
    if not said:
        sampled = any(r.get("machine") for r in early + late)
        said.append(
            "nothing sampled changed with it (tokens, data wait, the GPU's clock, the host's CPU)"
            if sampled
            else "the run's lines carry no machine samples (written before they were taken)"
        )
    return said
