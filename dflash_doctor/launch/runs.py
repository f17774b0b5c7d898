"""Run records: every launch and every refusal, with the environment it saw and how it ended.

After a bad run, `dflash-doctor runs show ID` compares its environment with the last successful
run's (the story's "previous run was at 20k tps, undo" made answerable).

A record is our own state file, so reading one checks its shape and every field's type: a damaged record
is skipped with a warning by `runs` and is a named error for `runs show`. A `running` record whose launcher
process is gone (killed with SIGKILL, the machine rebooted) reads as `lost`, with when it was last seen.
"""

from __future__ import annotations

import json
import secrets
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dflash_base.atomic import write_json_atomic
from dflash_base.errors import DoctorError
from dflash_doctor.paths import check_folder_path, runs_dir

RECORD_SCHEMA = "dflash-doctor/run/v2"
# v1 named `forced_findings` `overrides`, the word every other part of the tool uses for --set values; a v1
# record reads as the same record (`from_json`).
OLD_RECORD_SCHEMAS = {"dflash-doctor/run/v1": {"overrides": "forced_findings"}}
STATUSES = ("refused", "running", "succeeded", "failed", "interrupted", "lost")
FINISHED = frozenset({"refused", "succeeded", "failed", "interrupted"})


class DamagedRecord(ValueError):
    """A record.json that is not a run record of ours (torn, empty, garbage, wrong types)."""


@dataclass
class RunRecord:
    id: str
    created: float
    status: str
    config_path: str | None = None
    config_text: str | None = None
    environment: dict[str, Any] = field(default_factory=dict)  # an environment lock (see lock.py)
    findings: list[dict[str, Any]] = field(default_factory=list)
    forced_findings: list[str] = field(default_factory=list)  # failing finding ids launched over with --force
    command: list[str] = field(default_factory=list)
    plan: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    finished: float | None = None
    output_dir: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)  # the trainer's summary.json
    snapshot: str | None = None
    notes: list[str] = field(default_factory=list)
    host: str | None = None  # where the launcher runs: its pid means something only there
    launcher_pid: int | None = None
    launcher_started: float | None = None  # the launcher's start time: a reused pid is not the launcher
    last_seen: float | None = None  # the launcher's last heartbeat while the run was running
    stderr_tail: list[str] = field(default_factory=list)  # a failed run's last stderr lines: why it failed
    reason: str | None = None  # why a failed run failed, in one line (a rank's named error, or its summary's)
    timeline: dict[str, Any] = field(default_factory=dict)  # where each second to the first step went
    floor: dict[str, Any] = field(
        default_factory=dict
    )  # the export decoded on `[eval] prompts` (launch/floor.py)

    @property
    def seconds(self) -> float | None:
        return None if self.finished is None else self.finished - self.created

    @property
    def tokens_per_second(self) -> float | None:
        """Tokens / seconds over the run's steady steps (`summary.json`'s `steady_tok_s`); a record written
        before that figure existed gives its mean of per-step rates, which ran up to 8% high."""
        value = self.metrics.get("steady_tok_s", self.metrics.get("mean_tok_s"))
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def drift_finding(self) -> str | None:
        """One line when the run's steady steps slowed or sped up as it went (`trainer.run.drift`), else None."""
        drift = self.metrics.get("step_drift")
        finding = drift.get("finding") if isinstance(drift, dict) else None
        return finding if isinstance(finding, str) else None

    def to_json(self) -> dict[str, Any]:
        return {"schema": RECORD_SCHEMA, **asdict(self)}

    @classmethod
    def from_json(cls, data: Any) -> RunRecord:
        """Validated: raises DamagedRecord naming the first field of the wrong type."""
        if not isinstance(data, dict):
            raise DamagedRecord(f"not a JSON object but a {type(data).__name__}")
        schema = data.get("schema")
        if schema != RECORD_SCHEMA and schema not in OLD_RECORD_SCHEMAS:
            raise DamagedRecord(f"schema {schema!r}, expected {RECORD_SCHEMA!r}")
        renamed = OLD_RECORD_SCHEMAS.get(schema, {})
        data = {renamed.get(k, k): v for k, v in data.items()}
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for name in ("id", "created", "status"):
            if name not in fields:
                raise DamagedRecord(f"no {name!r}")
        for name, value in fields.items():
            if value is None and name not in REQUIRED:
                continue
            items = ITEM_TYPES.get(name)
            if (
                isinstance(value, bool)
                or not isinstance(value, FIELD_TYPES[name])
                or (items is not None and not all(isinstance(item, items) for item in value))  # type: ignore[attr-defined]  # a list: checked just above
            ):
                raise DamagedRecord(
                    f"{name!r} is {json.dumps(value, default=str)[:60]}, not of the right type"
                )
        if fields["status"] not in STATUSES:
            raise DamagedRecord(f"unknown status {fields['status']!r}")
        return cls(**fields)

    def launcher_gone(self) -> bool:
        """True when this record says `running` but its launcher no longer runs (on this host)."""
        if self.status != "running" or self.launcher_pid is None or self.host != socket.gethostname():
            return False
        return not process_is(self.launcher_pid, self.launcher_started)


REQUIRED = frozenset({"id", "created", "status"})
_NUMBER = (int, float)
FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "created": _NUMBER,
    "status": (str,),
    "config_path": (str,),
    "config_text": (str,),
    "environment": (dict,),
    "findings": (list,),
    "forced_findings": (list,),
    "command": (list,),
    "plan": (dict,),
    "exit_code": (int,),
    "finished": _NUMBER,
    "output_dir": (str,),
    "metrics": (dict,),
    "snapshot": (str,),
    "notes": (list,),
    "host": (str,),
    "launcher_pid": (int,),
    "launcher_started": _NUMBER,
    "last_seen": _NUMBER,
    "stderr_tail": (list,),
    "reason": (str,),
    "timeline": (dict,),
    "floor": (dict,),
}
ITEM_TYPES: dict[str, type] = {
    "findings": dict,
    "forced_findings": str,
    "command": str,
    "notes": str,
    "stderr_tail": str,
}


def this_launcher() -> dict[str, Any]:
    """The fields that tie a record to the process that launched it."""
    import psutil

    me = psutil.Process()
    return {"host": socket.gethostname(), "launcher_pid": me.pid, "launcher_started": me.create_time()}


def process_is(pid: int, started: float | None) -> bool:
    """Is `pid` alive and the same process that started at `started`?"""
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(process.create_time() - started) < 1.0
    except psutil.Error:
        return False


def new_run_id(now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    return f"{stamp}-{secrets.token_hex(2)}"


class RunStore:
    """One folder per run under the state root; `record.json` rewritten atomically at each stage."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or runs_dir()

    def path(self, run_id: str) -> Path:
        return self.root / run_id / "record.json"

    def create(self, status: str, run_id: str | None = None, **fields: Any) -> RunRecord:
        now = time.time()
        record = RunRecord(id=run_id or new_run_id(now), created=now, status=status, **fields)
        self.save(record)
        return record

    def save(self, record: RunRecord) -> None:
        if record.status not in STATUSES:
            raise ValueError(f"unknown run status {record.status!r}")
        write_json_atomic(self.path(record.id), record.to_json())

    def load(self, run_id: str) -> RunRecord:
        """One record by id or unique prefix; a damaged one is a DoctorError naming the file."""
        if not run_id.strip():
            raise DoctorError(
                f"an empty run id ({run_id!r})",
                hint="give a run id or its first characters: `dflash-doctor runs` lists them",
            )
        matches = [p for p in self._record_paths() if p.parent.name.startswith(run_id)]
        if not matches:
            raise DoctorError(f"no run {run_id!r}", hint="list runs with `dflash-doctor runs`")
        if len(matches) > 1 and not any(p.parent.name == run_id for p in matches):
            raise DoctorError(
                f"run id {run_id!r} is ambiguous ({len(matches)} runs)", hint="give more characters"
            )
        path = next((p for p in matches if p.parent.name == run_id), matches[0])
        try:
            return self._read(path)
        except (OSError, ValueError) as exc:
            raise DoctorError(
                f"run record {path} is damaged: {exc}",
                hint=f"move it aside (mv {path} {path}.damaged); `dflash-doctor runs` lists the others",
            ) from exc

    def all(self, damaged: list[str] | None = None) -> list[RunRecord]:
        """Every readable record, oldest first. A torn, empty or foreign file is skipped, never fatal;
        when `damaged` is given, a line naming each skipped file is appended to it."""
        records = []
        for path in self._record_paths():
            try:
                records.append(self._read(path))
            except (OSError, ValueError) as exc:
                if damaged is not None:
                    damaged.append(f"{path}: {exc}")
        return sorted(records, key=lambda r: (r.created, r.id))

    def last_successful(self, before: RunRecord | None = None) -> RunRecord | None:
        good = [
            r
            for r in self.all()
            if r.status == "succeeded" and (before is None or r.created < before.created)
        ]
        return good[-1] if good else None

    def _record_paths(self) -> list[Path]:
        check_folder_path(self.root, "the run records' folder")  # a home that is a file: said, not "no runs"
        if not self.root.is_dir():
            return []
        return sorted(p / "record.json" for p in self.root.iterdir() if (p / "record.json").is_file())

    @staticmethod
    def _read(path: Path) -> RunRecord:
        """A validated record; a `running` one whose launcher is gone comes back as `lost`."""
        with open(path, "rb") as handle:
            raw = handle.read()
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DamagedRecord("empty" if not raw.strip() else f"not JSON ({exc})") from exc
        record = RunRecord.from_json(data)
        if record.launcher_gone():
            record.status = "lost"
        return record


def describe_age(record: RunRecord, now: float | None = None) -> str:
    return age(record.created, now)


def age(when: float, now: float | None = None) -> str:
    delta = (now or time.time()) - when
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if delta >= size:
            return f"{int(delta // size)}{unit} ago"
    return f"{int(delta)}s ago"
