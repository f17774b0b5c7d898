"""The files a run writes into `output.dir`, named once: the trainer writes them, the launcher, `runs` and
the benches read them back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"  # one line per logged step (trainer.run.metrics.StepMetrics)
SUMMARY_FILE = (
    "summary.json"  # written when the run ends, also when it failed (trainer.run.metrics.summarize)
)
EXPORT_DIR = "export"  # the drafter for the engines (trainer.model.export)


def metrics_path(output_dir: str | Path) -> Path:
    return Path(output_dir) / METRICS_FILE


def summary_path(output_dir: str | Path) -> Path:
    return Path(output_dir) / SUMMARY_FILE


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every line of a metrics file (none when it is not there)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_summary(output_dir: Path) -> dict[str, Any]:
    """A run's summary.json, or {} when it is missing or not a JSON object (a run stopped before writing it)."""
    try:
        data = json.loads(summary_path(output_dir).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
