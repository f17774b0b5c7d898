"""Warm-ups that already ran against the cache as it is now: a warm start may skip the warm-up child.

Before every launch the launcher runs the trainer's warm-up in one child process, so that workers never
compile at the same time from a cold cache. From a warm cache that child only loads, but it still costs a
start-up: on two H200s at qwen3-8b-b16 its warm-up took 7.8 s, and an interpreter that imports torch,
transformers and the trainer takes another 13-15 s there.

After a child succeeds, a record is kept: a key (build fingerprint, the config with the fields that cannot
change a compiled graph left out, the devices, the interpreter, the trainer's source, the TORCH*/TRITON*
environment variables) and every cache file
present right after it (path and size). A later launch with the same key skips the child only if every
one of those files is still there, and every compiled artifact among them with the same size. A new torch,
other shapes, another device, an edited trainer, or one deleted or rewritten artifact: the child runs. A
needless child costs seconds; a wrong skip would let the workers compile concurrently, so every doubt runs
the child.

Not every file in the cache is a compiled artifact written once under a content hash. Inductor also keeps
state that every torch process rewrites in place when it learns something: `cache/<system hash>` (benchmark
timings: pad_mm, collective estimates, autotuned choices), `*.best_config` (a kernel's autotune pick, with
the time the tuning took), `dynamo/` profiles, memoizer dumps. The workers of a run (the target ranks compile
their own layers into the same folder) rewrite them, so their sizes change after every run although nothing
the warm-up compiled is gone: judged by size, the second launch of a config always ran the child again
(issue 17). For those only presence counts.

A snapshot carries the records whose files it holds, and a restore adds them here: a cache restored on a
fresh machine of the same kind then starts as fast as a warm one (on two H200s the child and its start-up
were 23 s of a 61 s time to first step). The key still has to match on this machine, and the files are
still checked, so a carried record can only skip what a local one would.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_base.atomic import write_json_atomic
from dflash_base.errors import DoctorError
from dflash_doctor.cache.archive import collect_files
from dflash_doctor.cache.fingerprint import BuildFingerprint
from dflash_doctor.cache.folder_lock import lock_file
from dflash_doctor.cache.locations import snapshots_dir
from dflash_doctor.paths import make_private_dirs

SCHEMA = "dflash-doctor/warm-records/v1"
RECORDS_FILE = "warm-records.json"  # in the dflash-doctor home, beside the snapshots folder
KEEP_RECORDS = 20
MAX_FILES = 100_000  # a cache folder shared with much else: keep no record, always run the child
ALWAYS_ENV = "DFLASH_DOCTOR_ALWAYS_WARM"  # set to 1: run the warm-up child on every launch
LOCK_TIMEOUT_S = 60.0  # a write takes milliseconds; a lock held this long belongs to a hung process

_TRAINER_DIR = Path(__file__).resolve().parents[2] / "trainer"


def trainer_source_digest(folder: Path = _TRAINER_DIR) -> str:
    """sha256 over the trainer's Python files: an edited model or loss compiles different graphs."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.py")):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


# Environment variables that steer compilation or device numbering (TORCHINDUCTOR_MAX_AUTOTUNE, ...).
_ENV_PREFIXES = ("TORCH", "PYTORCH", "TRITON", "CUDA_VISIBLE_DEVICES")
# ... except where the caches live: that changes no graph, and the recorded files are checked where they are
# now (another home on another machine holds the same restored files under another folder).
_ENV_LOCATIONS = frozenset({"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TRITON_HOME"})


def warm_key(
    fingerprint: BuildFingerprint,
    graph_config: Mapping[str, Any],
    device_type: str,
    devices: tuple[str, ...],
    python: str,
    environ: Mapping[str, str] | None = None,
    trainer_digest: str | None = None,
) -> str:
    """What a warm-up's graphs depend on, as one digest. `graph_config`: the config's fields that can change a
    compiled graph, as the launch reads them (`launch.compile_cache.graph_fields`: each field declares its effect
    in the trainer's run spec, which the cache store does not import)."""
    facts = {
        "build": fingerprint.to_json(),
        "config": dict(graph_config),
        "device_type": device_type,
        "devices": list(devices),
        "python": python,
        "environ": {
            k: v
            for k, v in sorted((environ or {}).items())
            if k.startswith(_ENV_PREFIXES) and k not in _ENV_LOCATIONS
        },
        "trainer": trainer_digest if trainer_digest is not None else trainer_source_digest(),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


def cache_files(roots: Mapping[str, Path]) -> dict[str, int]:
    """`label/relative/path` -> size of every file a snapshot of these roots would hold."""
    files, _links = collect_files(dict(roots))
    return {f.archive_path: f.size for f in files}


# Where Inductor and Triton write compiled artifacts once, under a name derived from their content or key.
_ARTIFACT_FOLDERS = frozenset({"fxgraph", "aotautograd", "triton"})
_REWRITTEN_SUFFIXES = (".best_config",)  # beside the kernels in `<2 chars>/`, but rewritten by each tuning


def is_artifact(archive_path: str) -> bool:
    """True for a compiled artifact (its size is fixed once written); False for state that torch processes
    rewrite in place (benchmark and autotune results, profiles): of those only presence is checked."""
    _label, _, relative = archive_path.partition("/")
    top, sep, _rest = relative.partition("/")
    if not sep or relative.endswith(_REWRITTEN_SUFFIXES):
        return False
    return top in _ARTIFACT_FOLDERS or len(top) == 2  # `<2 chars>/c<hash>.py|.cpp|.so`: content-addressed


def still_matches(recorded_size: int, size: int | None, archive_path: str) -> bool:
    """Whether a recorded file is still what the warm-up left (`size` None: the file is gone)."""
    return size is not None and (size == recorded_size or not is_artifact(archive_path))


@dataclass(frozen=True)
class WarmRecord:
    key: str
    when: float
    devices: tuple[str, ...]
    files: dict[str, int]
    snapshot: str | None = None  # the snapshot that carried it here; None: the warm-up ran on this machine

    def missing(self, roots: Mapping[str, Path]) -> list[str]:
        """Recorded files that are gone, or artifacts that changed size (stops at the first few: one is
        enough)."""
        gone = []
        for name, size in self.files.items():
            label, _, relative = name.partition("/")
            root = roots.get(label)
            try:
                now = (root / relative).stat().st_size if root is not None else None
            except OSError:
                now = None
            if not still_matches(size, now, name):
                gone.append(name)
                if len(gone) >= 3:
                    break
        return gone


class WarmRecords:
    """The records file (JSON, written beside and renamed). Unreadable or foreign: treated as empty."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _load(self) -> list[dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return []
        if (
            not isinstance(data, dict)
            or data.get("schema") != SCHEMA
            or not isinstance(data.get("records"), list)
        ):
            return []
        return [r for r in data["records"] if isinstance(r, dict)]

    def find(self, key: str) -> WarmRecord | None:
        for entry in self._load():
            if entry.get("key") == key and isinstance(entry.get("files"), dict) and entry["files"]:
                snapshot = entry.get("snapshot")
                return WarmRecord(
                    key,
                    float(entry.get("when", 0)),
                    tuple(entry.get("devices", ())),
                    dict(entry["files"]),
                    snapshot if isinstance(snapshot, str) else None,
                )
        return None

    def save(self, key: str, devices: tuple[str, ...], files: dict[str, int]) -> None:
        if not files or len(files) > MAX_FILES:
            return
        self._add([{"key": key, "when": time.time(), "devices": list(devices), "files": files}])

    def covered_by(self, files: Mapping[str, int]) -> list[dict[str, Any]]:
        """The records whose every file is in `files` (archive path -> size), artifacts with the same size:
        what a snapshot holding those files can carry. The `snapshot` field is left out: a restore sets its own."""
        covered = []
        for entry in self._load():
            recorded = entry.get("files")
            if (
                isinstance(recorded, dict)
                and recorded
                and all(still_matches(s, files.get(p), p) for p, s in recorded.items())
            ):
                covered.append({k: v for k, v in entry.items() if k != "snapshot"})
        return covered

    def adopt(self, entries: Iterable[Any], snapshot: str) -> int:
        """Add the records a restored snapshot carried (malformed ones are dropped); returns how many."""
        valid = [dict(e, snapshot=snapshot) for e in entries if _well_formed(e)]
        if valid:
            self._add(valid)
        return len(valid)

    def _add(self, new: list[dict[str, Any]]) -> None:
        """Keep the newest KEEP_RECORDS, one per key (a new entry replaces an old one with its key).

        Read, merge and rename under a lock beside the file: two launches from one home at once would
        otherwise each write what it read, and one record would be lost (a needless child later)."""
        keys = {e["key"] for e in new}
        try:
            make_private_dirs(self.path.parent)
            if self.path.is_dir() or self.path.is_symlink():
                raise IsADirectoryError(21, "not a regular file", str(self.path))
            lock = Path(f"{self.path}.lock")
            busy = DoctorError(
                f"another launch holds {lock} for more than {LOCK_TIMEOUT_S:.0f} s",
                hint="wait for it, then try again",
            )
            with lock_file(lock, "the warm-up records lock", LOCK_TIMEOUT_S, busy, f"remove {lock}"):
                kept = [r for r in self._load() if r.get("key") not in keys] + new
                write_json_atomic(self.path, {"schema": SCHEMA, "records": kept[-KEEP_RECORDS:]})
        except OSError as exc:
            raise DoctorError(
                f"cannot write the warm-up records {self.path}: {getattr(exc, 'strerror', None) or exc}",
                hint=f"move {self.path} away if it is not a file of warm-up records; it is re-created",
            ) from None


def default_records() -> WarmRecords:
    """This dflash-doctor home's records (DFLASH_DOCTOR_HOME moves them with the snapshots)."""
    return WarmRecords(snapshots_dir().parent / RECORDS_FILE)


def _well_formed(entry: Any) -> bool:
    """A carried record is data from an archive: it must look exactly like one `save` writes."""
    if not isinstance(entry, dict):
        return False
    key, when, devices, files = (entry.get(k) for k in ("key", "when", "devices", "files"))
    return (
        isinstance(key, str)
        and len(key) == 64
        and isinstance(when, int | float)
        and isinstance(devices, list)
        and all(isinstance(d, str) for d in devices)
        and isinstance(files, dict)
        and 0 < len(files) <= MAX_FILES
        and all(isinstance(p, str) and isinstance(s, int) and s >= 0 for p, s in files.items())
    )


def run_reason(
    records: WarmRecords, key: str, roots: Mapping[str, Path], environ: Mapping[str, str]
) -> str | None:
    """Why the warm-up child must run (None: it can be skipped). Printed with the launch, so a child that
    runs again says which record or file made it."""
    if environ.get(ALWAYS_ENV, "") not in ("", "0"):
        return f"{ALWAYS_ENV} is set"
    record = records.find(key)
    if record is None:
        return "no warm-up of this build, config, devices and trainer recorded"
    missing = record.missing(roots)
    if missing:
        return f"changed since the recorded warm-up: {', '.join(missing)}"
    return None


def skip_reason(
    records: WarmRecords, key: str, roots: Mapping[str, Path], environ: Mapping[str, str]
) -> str | None:
    """Why the warm-up child can be skipped (None: it must run, see `run_reason`)."""
    if run_reason(records, key, roots, environ) is not None:
        return None
    record = records.find(key)
    assert record is not None  # run_reason found it
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(record.when))
    carried = f" (record carried by snapshot {record.snapshot})" if record.snapshot else ""
    return (
        f"warm-up skipped: this build and config were warmed at {when}{carried}; "
        f"its {len(record.files)} cache files are intact"
    )
