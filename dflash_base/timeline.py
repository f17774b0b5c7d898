"""Where a launch's seconds go: named marks, appended by whichever process reaches them, one line each.

The launcher and the first drafter worker are different processes (torchrun stands between them), so the
worker's marks travel through a file the launcher names in `TIMELINE_ENV`: each mark is one JSON line
written with a single `write` to a file opened `O_APPEND`, so lines from one writer never interleave and a
crash leaves whole lines (a torn last line is skipped on reading). A mark is the wall-clock time a phase
*ended*; a phase lasts from the previous mark to its own. Without the variable, `mark` does nothing: a
trainer started by hand writes no file.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

TIMELINE_ENV = "DFLASH_DOCTOR_TIMELINE"


def append_mark(path: Path | str, phase: str, at: float | None = None, **extra: Any) -> None:
    """One line `{"phase", "at", "pid", ...}`, appended in one write (whole, or not at all)."""
    line = json.dumps({"phase": phase, "at": time.time() if at is None else at, "pid": os.getpid(), **extra})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def mark(phase: str, at: float | None = None, **extra: Any) -> None:
    """`append_mark` to the file `TIMELINE_ENV` names; nothing without it. A timeline must never fail a
    run: a file that cannot be written loses the mark, not the training."""
    path = os.environ.get(TIMELINE_ENV)
    if path:
        with contextlib.suppress(OSError):
            append_mark(path, phase, at, **extra)


def read_marks(path: Path | str) -> list[dict[str, Any]]:
    """The file's valid marks in the order written; a missing file is no marks, a bad line is skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    marks = []
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if (
            isinstance(item, dict)
            and isinstance(item.get("phase"), str)
            and isinstance(item.get("at"), (int, float))
            and not isinstance(item.get("at"), bool)
        ):
            marks.append(item)
    return marks


_REMEMBERED: list[tuple[str, float]] = []


def remember(phase: str) -> None:
    """Note a phase's end now, to be written later by `flush`: a worker reaches its first marks before it
    knows whether it is the one that reports (the first drafter: the rank whose first step is the run's)."""
    _REMEMBERED.append((phase, time.time()))


def flush() -> None:
    """Write the remembered marks, in order, with the times they were noted."""
    while _REMEMBERED:
        phase, at = _REMEMBERED.pop(0)
        mark(phase, at)


def forget() -> None:
    """Drop the remembered marks (a rank that does not report)."""
    _REMEMBERED.clear()
