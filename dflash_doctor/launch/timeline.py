"""The launch timeline: where each second from `dflash-doctor train` to the first metrics line went.

Issue 40 §2: a cold qwen3-8b-b16 launch took 84.6 s to its first step and nobody could say which part was
which. The launcher marks its own phases (gate, deep probe, warm-up) here; the first drafter worker marks
the rest (torchrun start, worker start, imports, process group, model build, compile, first step) in the
file `dflash_base.timeline` appends to, which the launcher names in the workers' environment and reads
back when torchrun ends. A lone rank started without torchrun (`direct.py`) marks "worker spawn" instead
of "torchrun start": only its own interpreter's start, no torchrun between. Each phase lasts from the previous mark to its own, so the phases add up to the
time to the first step; the deep probe's own seconds are kept beside it, since it runs beside the static
checks (`gate.py`) and only the wait for it after them is on the path.

A lone rank started beside the gate as its own warm-up (`lone_rank.py`) puts the rank on the path instead: the
launcher's `rank start` (the checks its compile depends on, the cache made ready for it), the rank's own phases
to its `compile`, its `go wait` (from its compile's end until the launcher's go: the rest of the gate, when that
was longer), then the first step. The gate and the deep probe ran beside the rank: they are listed apart
(`beside`), each from the previous one's end, and do not add up to the time to the first step.
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
RANK_START = "rank start"  # the launcher started a lone rank beside its gate (lone_rank.py)
GO_WAIT = "go wait"  # that rank's wait, compiled, for the launcher's go
EARLY_PHASES = (
    "launcher start",
    RANK_START,
    "worker spawn",
    "worker start",
    "imports",
    "process group",
    "model build",
    "compile",
    GO_WAIT,
    "first step",
)
BESIDE_THE_RANK = ("gate", "deep probe")  # the launcher's phases while an early rank starts and compiles
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

    def _ends(self) -> dict[str, float]:
        ends = dict(self.marks)
        if self.path is not None:
            for item in read_marks(self.path):
                if item["phase"] in (*WORKER_PHASES, GO_WAIT):
                    ends.setdefault(item["phase"], float(item["at"]))
        return ends

    @property
    def early_rank(self) -> bool:
        """A lone rank was started beside the gate: the rank, not the gate, is on the path."""
        return RANK_START in self.marks

    def phases(self) -> list[dict[str, Any]]:
        """Every phase reached, in launch order: start and end in seconds from the command's start."""
        return self._rows(EARLY_PHASES if self.early_rank else PHASES, self.began)

    def beside(self) -> list[dict[str, Any]]:
        """The launcher's phases that ran beside an early rank (none otherwise), from its own start's end."""
        if not self.early_rank:
            return []
        return self._rows(BESIDE_THE_RANK, self.marks.get("launcher start", self.began))

    def _rows(self, order: tuple[str, ...], since: float) -> list[dict[str, Any]]:
        ends = self._ends()
        rows, previous = [], since
        for phase in order:
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
        beside = {"beside": self.beside()} if self.early_rank else {}
        return {"phases": rows, "first_step_s": first, **beside, **self.extra}


def timeline_rows(data: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(phase, seconds, ends at) for the `-v` table; a probe that ran beside the gate says so."""
    out = []
    for row in data.get("phases", []):
        seconds = f"{row['seconds']:.2f}"
        if row["phase"] == "deep probe" and data.get("probe_s") is not None:
            seconds += f" (probe ran {data['probe_s']:.2f}, beside the static checks)"
        out.append((row["phase"], seconds, f"{row['end_s']:.2f}"))
    for row in data.get("beside") or []:  # the gate and the probe, while an early rank started and compiled
        seconds = f"{row['seconds']:.2f} (beside the rank, not on the path)"
        if row["phase"] == "deep probe" and data.get("probe_s") is not None:
            seconds += f"; probe ran {data['probe_s']:.2f}"
        out.append((f"  {row['phase']}", seconds, f"{row['end_s']:.2f}"))
    inside = data.get("inside") or {}
    if inside:  # the launcher's steps inside its phases, in the order they ended
        steps = ", ".join(f"{step} {at:.2f}" for step, at in sorted(inside.items(), key=lambda kv: kv[1]))
        out.append(("  inside (ends at)", "", steps))
    return out
