"""The launch timeline: where each second from `dflash-doctor train` to the first metrics line went.

Issue 40 §2: a cold qwen3-8b-b16 launch took 84.6 s to its first step and nobody could say which part was
which. The launcher marks its own phases (gate, deep probe, warm-up) here; the first drafter worker marks
the rest (torchrun start, worker start, imports, process group, model build, compile, first step) in the
file `dflash_base.timeline` appends to, which the launcher names in the workers' environment and reads
back when torchrun ends. A lone rank started without torchrun (`direct.py`) marks "worker spawn" instead
of "torchrun start": only its own interpreter's start, no torchrun between. Each phase lasts from the previous mark to its own, so the phases add up to the
time to the first step; the deep probe's own seconds are kept beside it, since it runs beside the static
checks (`gate.py`) and only the wait for it after them is on the path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_base.timeline import TIMELINE_ENV, read_marks

LAUNCHER_PHASES = ("launcher start", "gate", "deep probe", "warm-up")
SPAWN_PHASES = ("torchrun start", "worker spawn")  # one of them: torchrun's start, or a lone rank's own
WORKER_PHASES = (
    *SPAWN_PHASES,
    "worker start",
    "imports",
    "process group",
    "model build",
    "compile",
    "first step",
)
PHASES = LAUNCHER_PHASES + WORKER_PHASES
TIMELINE_FILE = "timeline.jsonl"


@dataclass
class LaunchTimeline:
    """The launcher's marks (wall-clock ends of phases), from `began` (the command's start)."""

    began: float = field(default_factory=time.time)
    marks: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the probe's own seconds
    path: Path | None = None  # the workers' marks file (set once the run has a folder)

    @classmethod
    def from_process_start(cls) -> LaunchTimeline:
        """From this process's start (the interpreter and the CLI's imports are the first phase), when the
        OS says; else from now."""
        now = time.time()
        try:
            import psutil

            began = min(now, psutil.Process().create_time())
        except Exception:  # no process start time on this platform: the timeline starts here
            began = now
        timeline = cls(began=began)
        timeline.mark("launcher start", now)
        return timeline

    def mark(self, phase: str, at: float | None = None) -> None:
        """A launcher phase ended (now, or `at`); the first mark of a phase counts."""
        self.marks.setdefault(phase, time.time() if at is None else at)

    def note(self, step: str) -> None:
        """A step inside a launcher phase ended now: kept in `extra["inside"]` as seconds from the start, so a
        slow phase says which of its steps took the time (the gate on a freshly started H200: 7.5 s before the
        warm-up could start, of which nothing said more)."""
        self.extra.setdefault("inside", {})[step] = round(time.time() - self.began, 3)

    def worker_environ(self, environ: dict[str, str], folder: Path) -> dict[str, str]:
        """The workers' environment, naming a fresh marks file in the run's own folder."""
        self.path = folder / TIMELINE_FILE
        self.path.unlink(missing_ok=True)  # a relaunch into the same record folder starts a new file
        return {**environ, TIMELINE_ENV: str(self.path)}

    def phases(self) -> list[dict[str, Any]]:
        """Every phase reached, in launch order: start and end in seconds from the command's start."""
        ends = dict(self.marks)
        if self.path is not None:
            for item in read_marks(self.path):
                if item["phase"] in WORKER_PHASES:
                    ends.setdefault(item["phase"], float(item["at"]))
        rows, previous = [], self.began
        for phase in PHASES:
            if phase not in ends:
                continue
            end = ends[phase]
            rows.append(
                {
                    "phase": phase,
                    "start_s": round(previous - self.began, 3),
                    "end_s": round(end - self.began, 3),
                    "seconds": round(end - previous, 3),
                }
            )
            previous = end
        return rows

    def to_json(self) -> dict[str, Any]:
        rows = self.phases()
        first = next((r["end_s"] for r in rows if r["phase"] == "first step"), None)
        return {"phases": rows, "first_step_s": first, **self.extra}


def timeline_rows(data: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(phase, seconds, ends at) for the `-v` table; a probe that ran beside the gate says so."""
    out = []
    for row in data.get("phases", []):
        seconds = f"{row['seconds']:.2f}"
        if row["phase"] == "deep probe" and data.get("probe_s") is not None:
            seconds += f" (probe ran {data['probe_s']:.2f}, beside the static checks)"
        out.append((row["phase"], seconds, f"{row['end_s']:.2f}"))
    inside = data.get("inside") or {}
    if inside:  # the launcher's steps inside its phases, in the order they ended
        steps = ", ".join(f"{step} {at:.2f}" for step, at in sorted(inside.items(), key=lambda kv: kv[1]))
        out.append(("  inside (ends at)", "", steps))
    return out
