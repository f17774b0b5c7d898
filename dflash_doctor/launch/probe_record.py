"""Passed deep probes, kept so that a launch in an unchanged environment need not probe again.

The deep probe imports torch in a child, initialises every GPU and compiles a flex proof: ~24 s of every
default `train` on an H200 (issue 17). What it proves depends only on what the environment lock records
(every distribution with its WHEEL tags and RECORD digest, torch's version and git commit, the sha256 of
every library torch resolves to, the relevant environment variables), the driver and the GPUs, the probe
child's own source, and the probe's options (flex proof or not). Those, hashed, are the key.

A probe whose deep findings all passed is kept under that key (one JSON file in `<state>/probes/`, beside the
run records) with its date and its raw report. A later gate with the same key reads the report back instead
of probing; the deep checks judge it again (a newer dflash-doctor judges an old report by its own rules) and
their findings say "from <date>". Any drift changes the key, so the probe runs again; `train --deep` always
probes; `check --deep` never reads these records.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_base.atomic import write_json_atomic
from dflash_doctor.deep.run import ProbeReport, probe_source_digest
from dflash_doctor.lock.lockfile import EnvironmentLock
from dflash_doctor.paths import probes_dir

SCHEMA = "dflash-doctor/probe-record/v1"
KEEP = 10  # one per environment the user launches from; older ones are pruned
_NOT_IDENTITY = ("created", "tool", "runtime")  # when, and by which dflash-doctor: not what was probed


def probe_key(lock: EnvironmentLock, options: dict[str, Any], probe_digest: str | None = None) -> str:
    """What a probe's verdicts depend on, as one digest."""
    identity = {k: v for k, v in lock.to_json().items() if k not in _NOT_IDENTITY}
    facts = {
        "lock": identity,
        "probe": probe_digest if probe_digest is not None else probe_source_digest(),
        "options": options,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class ProbeRecord:
    key: str
    when: float
    report: ProbeReport

    @property
    def date(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(self.when))


class ProbeRecords:
    """One file per key, written atomically; an unreadable or foreign file reads as no record."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or probes_dir()

    def path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def find(self, key: str) -> ProbeRecord | None:
        try:
            data = json.loads(self.path(key).read_text())
            if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("key") != key:
                return None
            return ProbeRecord(key, float(data["when"]), ProbeReport.from_json(data["report"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save(self, key: str, report: ProbeReport, when: float | None = None) -> ProbeRecord:
        record = ProbeRecord(key, time.time() if when is None else when, report)
        write_json_atomic(
            self.path(key),
            {"schema": SCHEMA, "key": key, "when": record.when, "report": report.to_json()},
        )
        self._prune()
        return record

    def _prune(self) -> None:
        def age(path: Path) -> float:
            try:
                return path.stat().st_mtime
            except OSError:  # removed by another launch meanwhile
                return 0.0

        for old in sorted(self.root.glob("*.json"), key=age, reverse=True)[KEEP:]:
            old.unlink(missing_ok=True)
