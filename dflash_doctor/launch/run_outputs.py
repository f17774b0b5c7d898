"""What a finished run left in its output folder, read by the launcher for the run record.

The workers write `summary.json` at the end and a `metrics.jsonl` line per logged step; a run stopped
early has only the latter, and an output folder reused across runs holds an earlier run's files too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer.runspec.outputs import metrics_path, read_summary, summary_path


def last_metrics(output_dir: Path, since: float) -> dict[str, Any]:
    """What this run reported last: its summary.json, else (a run stopped before writing one) its last
    metrics line. Files older than `since` are an earlier run's and are ignored."""
    if _written_since(summary_path(output_dir), since):
        summary = read_summary(output_dir)
        if summary:
            return summary
    metrics = metrics_path(output_dir)
    if not _written_since(metrics, since):
        return {}
    try:
        lines = metrics.read_text(encoding="utf-8", errors="replace").splitlines()
        last = json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return {}
    return {"last_step": last} if isinstance(last, dict) else {}


def _written_since(path: Path, since: float) -> bool:
    try:
        return path.stat().st_mtime >= since - 1.0
    except OSError:
        return False


def finished_at(output_dir: str | Path | None, since: float) -> float | None:
    """When the run's workers wrote their summary.json (they write it as the run ends), if they did after
    `since`: a run whose launcher was lost (SIGKILL) may still have finished (issue 58, N6), and `runs` says so."""
    if not output_dir:
        return None
    try:
        written = summary_path(Path(output_dir)).stat().st_mtime
    except OSError:
        return None
    return written if written >= since - 1.0 else None
