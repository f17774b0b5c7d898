"""The files a run writes into `output.dir`, named once: the trainer writes them, the launcher, `runs` and
the benches read them back. Also the one line a rank prints when it stops on an error a person can act on
(a full disk, a bad data line): the launcher shows that line as the run's reason, and keeps the other
processes' echoes of it (a peer gone, torchrun's summary) out of the terminal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"  # one line per logged step (trainer.run.metrics.StepMetrics)
SUMMARY_FILE = (
    "summary.json"  # written when the run ends, also when it failed (trainer.run.metrics.summarize)
)
EXPORT_DIR = "export"  # the drafter for the engines (trainer.model.export)
CHECKPOINTS_DIR = "checkpoints"  # one folder per checkpoint (trainer.run.checkpoint)
CHECKPOINT_PREFIX = "step_"  # `step_00000040`: a complete checkpoint; `.tmp-step_...` one being written
CHECKPOINT_STATE = "state.pt"  # in each checkpoint folder, beside CHECKPOINT_META
CHECKPOINT_META = "meta.json"  # the checkpoint's step and data position, for people and tools


ERROR_LINE_PREFIX = "dflash trainer: error: "  # then "rank N: <what is wrong>"


def error_line(rank: int | str, message: str) -> str:
    """The line a rank prints for an error a person can act on, before its process group closes."""
    return f"{ERROR_LINE_PREFIX}rank {rank}: {message}"


def reason_of(line: str) -> str | None:
    """The message of an `error_line` (None for any other line)."""
    if not line.startswith(ERROR_LINE_PREFIX):
        return None
    return line[len(ERROR_LINE_PREFIX) :].strip()


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
