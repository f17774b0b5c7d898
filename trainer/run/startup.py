"""Where a rank's start-up goes, from its process start to its first batch: the parts of time to first step.

Time to first step is what a user waits for after `dflash-doctor train`. The launcher's part (gate, cache
restore, warm-up child) is timed by the launcher; this is the workers' part, one line per rank:

    dflash trainer: rank 0 (target) ready in 41.2 s: start + imports 9.1, process group 3.2, build 12.0, ...
"""

from __future__ import annotations

import sys
import time

from dflash_base import timeline

# The clock's phases that are also the launch timeline's (`dflash_base.timeline`), under its names; the
# others ("build target", "optimizer + DDP") fall into the next timeline phase.
TIMELINE_PHASES = {
    "process group": "process group",
    "build": "model build",
    "compile": "compile",
    "go wait": "go wait",  # a lone rank started beside the launcher's gate, waiting for its go
}


def _process_age_s() -> float | None:
    """Seconds since this process started (interpreter start and imports included), if the OS says."""
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())
    except Exception:  # no psutil, or a platform without process start times: leave that part out
        return None


class StartupClock:
    """Named phases, each the time since the previous mark; the first is the process's age when created."""

    def __init__(self) -> None:
        age = _process_age_s()
        self.phases: dict[str, float] = {} if age is None else {"start + imports": age}
        self._last = time.monotonic()
        self.reports = False  # this rank writes the launch timeline (the first drafter: `report_timeline`)

    def report_timeline(self, reports: bool) -> None:
        """Once the rank knows its role: the first drafter writes the marks it remembered and every later one;
        the other ranks write none (one writer, so the file's order is the run's)."""
        self.reports = reports
        if reports:
            timeline.flush()
        else:
            timeline.forget()

    def timeline_mark(self, phase: str) -> None:
        """A launch-timeline phase ended now (on the reporting rank only)."""
        if self.reports:
            timeline.mark(phase)

    def mark(self, phase: str) -> float:
        now = time.monotonic()
        seconds = now - self._last
        self.phases[phase] = self.phases.get(phase, 0.0) + seconds
        self._last = now
        if phase in TIMELINE_PHASES:
            self.timeline_mark(TIMELINE_PHASES[phase])
        return seconds

    @property
    def total_s(self) -> float:
        return sum(self.phases.values())

    def as_dict(self) -> dict[str, float]:
        return {**{k: round(v, 2) for k, v in self.phases.items()}, "total": round(self.total_s, 2)}

    def report(self, rank: int, role: str) -> str:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in self.phases.items())
        line = f"dflash trainer: rank {rank} ({role}) ready in {self.total_s:.1f} s: {parts}"
        print(line, file=sys.stderr, flush=True)
        return line
