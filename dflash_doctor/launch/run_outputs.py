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
