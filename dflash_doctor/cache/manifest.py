"""The manifest: what a snapshot archive promises, member by member.

It is the archive's first member, so a reader knows every file's size and sha256 before it sees any
file's bytes, and can refuse a member the manifest does not list. Paths are archive paths:
`<root>/<relative path>` where root is `inductor` or `triton` (see CacheLocations.roots).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from dflash_base.errors import DoctorError
from dflash_doctor.cache.fingerprint import BuildFingerprint
from dflash_doctor.cache.fsops import printable

# A snapshot is `<name>.tar.zst` in the store (named here, not in `archive.py`, so that listing the store imports
# none of the archive writer).
ARCHIVE_SUFFIX = ".tar.zst"
PARTIAL_TAG = ".partial-"  # `.<name>.tar.zst.partial-<random>`: an archive being written

# v2: the archive is zstd frames with a seek table at the end (frames.py); v1 archives (one zstd
# stream) are still read. Versions before v2 stop at the first frame of a v2 archive: the bump makes
# them refuse it by its manifest schema, clearly, rather than as a truncated archive.
MANIFEST_SCHEMA = "dflash-doctor/cache-manifest/v2"
READABLE_SCHEMAS = ("dflash-doctor/cache-manifest/v1", MANIFEST_SCHEMA)
MANIFEST_MEMBER = "MANIFEST.json"
# Our own marker written at the root of every cache folder we restore or warm: the build it is for.
MARKER_NAME = ".dflash-doctor.json"
MARKER_SCHEMA = "dflash-doctor/cache-marker/v1"
# The ownership record in a backup of a previous cache (`<name>.bak-<id>`): ours to delete.
BACKUP_OWNER_NAME = ".dflash-doctor-backup.json"
BACKUP_SCHEMA = "dflash-doctor/cache-backup/v1"


class ArchiveError(DoctorError):
    """An archive we refuse: malformed, hostile, truncated, or not what its manifest says."""


class FileEntry(NamedTuple):
    """One archived file. A named tuple: a manifest holds thousands and is parsed on every restore."""

    path: str
    size: int
    sha256: str
    mode: int
    mtime: float


@dataclass
class CacheManifest:
    name: str
    created: float
    fingerprint: BuildFingerprint
    origins: dict[str, str]  # root label -> the folder it was read from
    files: list[FileEntry] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # links and special files left out
    tool_version: str = ""
    schema: str = MANIFEST_SCHEMA
    # Warm-up records (cache/warm_record.py) whose files this snapshot holds: a restore adds them to the
    # home's records, so `train` can skip its warm-up child. Optional: readers before it ignore the key.
    warm_records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def by_path(self) -> dict[str, FileEntry]:
        return {f.path: f for f in self.files}

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "name": self.name,
            "created": self.created,
            "tool_version": self.tool_version,
            "fingerprint": self.fingerprint.to_json(),
            "origins": self.origins,
            "skipped": self.skipped,
            "files": [[f.path, f.size, f.sha256, f.mode, f.mtime] for f in self.files],
            "warm_records": self.warm_records,
        }

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> CacheManifest:
        """Parse and validate; every defect is an ArchiveError naming what is wrong.

        The manifest comes from an archive anyone may have made: numbers must be finite and in range,
        text printable (no escape sequences reach a terminal), paths short enough to create."""
        data = _load_json(raw, "the manifest")
        if not isinstance(data, dict) or data.get("schema") not in READABLE_SCHEMAS:
            found = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise ArchiveError(
                f"unknown manifest schema {_shown(found)} (expected one of {', '.join(READABLE_SCHEMAS)})",
                hint="a snapshot from a newer dflash-doctor: upgrade, or take a new snapshot here",
            )
        try:
            files = [_file_entry(item) for item in _list(data, "files")]
            origins = data["origins"]
            if not isinstance(origins, dict):
                raise ValueError("origins must be an object")
            manifest = cls(
                name=_text(data["name"], "name"),
                created=_time(data["created"], "created"),
                fingerprint=fingerprint_from_json(data["fingerprint"]),
                origins={_text(k, "origins"): _text(v, "origins") for k, v in origins.items()},
                files=files,
                skipped=[
                    printable(s, 1024) for s in _list(data, "skipped", required=False) if isinstance(s, str)
                ],
                tool_version=_text(data.get("tool_version", ""), "tool_version", empty=True),
                schema=str(data["schema"]),
                warm_records=_dicts(data.get("warm_records")),
            )
        except KeyError as exc:
            raise ArchiveError(f"the manifest is malformed (field {exc} is missing)") from None
        except (TypeError, ValueError) as exc:
            raise ArchiveError(f"the manifest is malformed ({printable(str(exc))})") from None
        if len(manifest.by_path()) != len(files):
            raise ArchiveError("the manifest lists a file twice")
        return manifest


# Times: 0 to the year 2400 (a NaN, 1e300 or a negative time is a crafted archive, not a clock).
MAX_TIME = 13_569_465_600.0
MAX_FILE_BYTES = 1 << 44
MAX_NAME_BYTES = 255  # one path component (NAME_MAX)
MAX_PATH_BYTES = 3000  # inside the cache folder, leaving room for its own path under PATH_MAX
# Folders nested inside a cache root: real caches nest 3 (`fxgraph/<2>/f<key>/`, `triton/<device>/<key>/`);
# a tree 1,200 deep ended `status`, `snapshot` and `restore` in a RecursionError (issue 37, D1).
MAX_DEPTH = 32
_HEX = frozenset("0123456789abcdef")


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def _load_json(raw: bytes, what: str) -> Any:
    """json.loads that refuses NaN/Infinity and turns deep nesting into an error, not a traceback."""
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise ArchiveError(f"{what} is not valid JSON ({printable(str(exc))})") from None
    except RecursionError:
        raise ArchiveError(f"{what} is nested too deeply to be ours") from None


def _shown(value: object) -> str:
    return printable(repr(value), 80)


def _list(data: dict[str, Any], key: str, required: bool = True) -> list[Any]:
    value = data[key] if required else data.get(key, [])
    if not isinstance(value, list):
        raise ValueError(f"{key} must be a list, not {type(value).__name__}")
    return value


def _text(value: object, field_name: str, empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not empty):
        raise ValueError(f"{field_name} must be a non-empty string, not {_shown(value)}")
    if not value.isprintable() or len(value) > 4096:
        raise ValueError(f"{field_name} {_shown(value)} holds control characters or is too long")
    return value


def _integer(value: object, field_name: str, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high:
        raise ValueError(f"{field_name} must be an integer from 0 to {high}, not {_shown(value)}")
    return value


def _time(value: object, field_name: str) -> float:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_TIME
    ):
        raise ValueError(f"{field_name} must be a time from 1970 to 2400, not {_shown(value)}")
    return float(value)


def _file_entry(item: object) -> FileEntry:
    if not isinstance(item, list) or len(item) != 5:
        raise ValueError(f"a file entry must be [path, size, sha256, mode, mtime], not {_shown(item)}")
    path, size, digest, mode, mtime = item
    path = _text(path, "a file path")
    encoded = path.encode("utf-8", "surrogateescape")
    if len(encoded) > MAX_PATH_BYTES or any(len(part) > MAX_NAME_BYTES for part in encoded.split(b"/")):
        raise ValueError(f"the path {_shown(path)} is longer than a filesystem allows")
    if path.count("/") > MAX_DEPTH + 1:  # the root's label, MAX_DEPTH folders, the file
        raise ValueError(
            f"the path {_shown(path)} is more than {MAX_DEPTH} folders deep: no compiler nests so"
        )
    if not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= _HEX:
        raise ValueError(f"the sha256 of {_shown(path)} is not 64 hex digits")
    return FileEntry(
        path,
        _integer(size, f"the size of {path}", MAX_FILE_BYTES),
        digest,
        _integer(mode, f"the mode of {path}", 0o7777),
        _time(mtime, f"the mtime of {path}"),
    )


def fingerprint_from_json(value: object) -> BuildFingerprint:
    """A fingerprint read from an archive or a marker: an object whose texts are printable."""
    if not isinstance(value, dict):
        raise ValueError(f"fingerprint must be an object, not {_shown(value)}")
    for key in ("torch_version", "torch_git", "cuda", "triton_version", "python"):
        if value.get(key) is not None:
            _text(value[key], f"fingerprint.{key}", empty=True)
    gpus = value.get("gpu_names")
    if gpus is not None:
        if not isinstance(gpus, list):
            raise ValueError("fingerprint.gpu_names must be a list")
        for gpu in gpus:
            _text(gpu, "fingerprint.gpu_names")
    return BuildFingerprint.from_json(value)


def _dicts(value: Any) -> list[dict[str, Any]]:
    """The carried warm-up records: a list of objects, or nothing (each is validated when adopted)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def marker_bytes(
    fingerprint: BuildFingerprint,
    origin: str,
    snapshot: str | None,
    restore_id: str | None,
    created: float | None = None,
) -> bytes:
    """The marker file we leave in a cache folder: which build it holds, where it came from, and (in a
    restore's staging folder) which restore made it, as whom and when: what recovery needs to prove a
    staging folder is ours before it moves or deletes it."""
    data = {
        "schema": MARKER_SCHEMA,
        "fingerprint": fingerprint.to_json(),
        "origin": origin,
        "snapshot": snapshot,
        "restore_id": restore_id,
        "uid": os.getuid(),
        "created": time.time() if created is None else created,
    }
    return json.dumps(data, indent=1).encode()


def read_marker(raw: bytes) -> dict[str, Any] | None:
    """Our marker, or None when the bytes are not one (damaged, foreign, or nested to no end)."""
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("schema") != MARKER_SCHEMA:
        return None
    try:
        fingerprint_from_json(data.get("fingerprint"))
    except ValueError:
        return None
    return data


def backup_owner_bytes(
    restore_id: str,
    target: str,
    created: float,
    not_a_cache: bool = False,
    kept: str | None = None,
    sequence: int | None = None,
) -> bytes:
    """The ownership record a restore puts in the previous cache when it becomes `<name>.bak-...`:
    retention deletes only folders carrying one, and sorts them by `sequence` (one more than the backups of
    ours beside it had when it was made: the order they were made in, whatever the clock said; issue 58, C2),
    then `created`, never by name. `kept` says why retention must leave this one alone (a far smaller snapshot
    replaced it)."""
    data = {
        "schema": BACKUP_SCHEMA,
        "restore_id": restore_id,
        "uid": os.getuid(),
        "created": created,
        "target": target,
        "not_a_cache": not_a_cache,
        "kept": kept,
    }
    if sequence is not None:
        data["sequence"] = sequence
    return json.dumps(data, indent=1).encode()


def read_backup_owner(raw: bytes | None) -> dict[str, Any] | None:
    """The ownership record if it is ours (this uid), well-formed, with a finite creation time."""
    if raw is None:
        return None
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("schema") != BACKUP_SCHEMA or data.get("uid") != os.getuid():
        return None
    try:
        _time(data.get("created"), "created")
        _text(data.get("restore_id"), "restore_id")
        _text(data.get("target"), "target")
    except ValueError:
        return None
    return data
