"""Run records: every launch and every refusal, with the environment it saw and how it ended.

After a bad run, `dflash-doctor runs show ID` compares its environment with the last successful
run's (the story's "previous run was at 20k tps, undo" made answerable).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dflash_doctor.atomic import write_json_atomic
from dflash_doctor.errors import DoctorError
from dflash_doctor.paths import runs_dir

RECORD_SCHEMA = "dflash-doctor/run/v1"
STATUSES = ("refused", "running", "succeeded", "failed", "interrupted")


@dataclass
class RunRecord:
    id: str
    created: float
    status: str
    config_path: str | None = None
    config_text: str | None = None
    environment: dict[str, Any] = field(default_factory=dict)  # an environment lock (see lock.py)
    findings: list[dict[str, Any]] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)  # failing finding ids launched over with --force
    command: list[str] = field(default_factory=list)
    plan: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    finished: float | None = None
    output_dir: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)  # the trainer's summary.json
    snapshot: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float | None:
        return None if self.finished is None else self.finished - self.created

    @property
    def tokens_per_second(self) -> float | None:
        value = self.metrics.get("mean_tok_s")
        return float(value) if isinstance(value, (int, float)) else None

    def to_json(self) -> dict[str, Any]:
        return {"schema": RECORD_SCHEMA, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**fields)


def new_run_id(now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    return f"{stamp}-{secrets.token_hex(2)}"


class RunStore:
    """One folder per run under the state root; `record.json` rewritten atomically at each stage."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or runs_dir()

    def path(self, run_id: str) -> Path:
        return self.root / run_id / "record.json"

    def create(self, status: str, **fields: Any) -> RunRecord:
        now = time.time()
        record = RunRecord(id=new_run_id(now), created=now, status=status, **fields)
        self.save(record)
        return record

    def save(self, record: RunRecord) -> None:
        if record.status not in STATUSES:
            raise ValueError(f"unknown run status {record.status!r}")
        write_json_atomic(self.path(record.id), record.to_json())

    def load(self, run_id: str) -> RunRecord:
        matches = [p for p in self._record_paths() if p.parent.name.startswith(run_id)]
        if not matches:
            raise DoctorError(f"no run {run_id!r}", hint="list runs with `dflash-doctor runs`")
        if len(matches) > 1 and not any(p.parent.name == run_id for p in matches):
            raise DoctorError(
                f"run id {run_id!r} is ambiguous ({len(matches)} runs)", hint="give more characters"
            )
        path = next((p for p in matches if p.parent.name == run_id), matches[0])
        return self._read(path)

    def all(self) -> list[RunRecord]:
        """Every readable record, oldest first (a torn or foreign file is skipped, never fatal)."""
        records = []
        for path in self._record_paths():
            try:
                records.append(self._read(path))
            except (OSError, ValueError, TypeError):
                continue
        return sorted(records, key=lambda r: (r.created, r.id))

    def last_successful(self, before: RunRecord | None = None) -> RunRecord | None:
        good = [
            r
            for r in self.all()
            if r.status == "succeeded" and (before is None or r.created < before.created)
        ]
        return good[-1] if good else None

    def _record_paths(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return sorted(p / "record.json" for p in self.root.iterdir() if (p / "record.json").is_file())

    @staticmethod
    def _read(path: Path) -> RunRecord:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        if data.get("schema") != RECORD_SCHEMA:
            raise ValueError(f"{path}: not a run record")
        return RunRecord.from_json(data)


def describe_age(record: RunRecord, now: float | None = None) -> str:
    delta = (now or time.time()) - record.created
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if delta >= size:
            return f"{int(delta // size)}{unit} ago"
    return f"{int(delta)}s ago"


def run_output_dir(record: RunRecord) -> str | None:
    return record.output_dir if record.output_dir and os.path.isdir(record.output_dir) else None
