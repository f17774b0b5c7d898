"""The manifest: what a snapshot archive promises, member by member.

It is the archive's first member, so a reader knows every file's size and sha256 before it sees any
file's bytes, and can refuse a member the manifest does not list. Paths are archive paths:
`<root>/<relative path>` where root is `inductor` or `triton` (see CacheLocations.roots).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from dflash_doctor.cache.fingerprint import BuildFingerprint
from dflash_doctor.errors import DoctorError

# v2: the archive is zstd frames with a seek table at the end (frames.py); v1 archives (one zstd
# stream) are still read. Versions before v2 stop at the first frame of a v2 archive: the bump makes
# them refuse it by its manifest schema, clearly, rather than as a truncated archive.
MANIFEST_SCHEMA = "dflash-doctor/cache-manifest/v2"
READABLE_SCHEMAS = ("dflash-doctor/cache-manifest/v1", MANIFEST_SCHEMA)
MANIFEST_MEMBER = "MANIFEST.json"
# Our own marker written at the root of every cache folder we restore or warm: the build it is for.
MARKER_NAME = ".dflash-doctor.json"
MARKER_SCHEMA = "dflash-doctor/cache-marker/v1"


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
        """Parse and validate; every defect is an ArchiveError naming what is wrong."""
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ArchiveError(f"the manifest is not valid JSON ({exc})") from exc
        if not isinstance(data, dict) or data.get("schema") not in READABLE_SCHEMAS:
            found = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise ArchiveError(
                f"unknown manifest schema {found!r} (expected one of {', '.join(READABLE_SCHEMAS)})",
                hint="a snapshot from a newer dflash-doctor: upgrade, or take a new snapshot here",
            )
        try:
            files = [FileEntry(str(p), int(s), str(h), int(m), float(t)) for p, s, h, m, t in data["files"]]
            manifest = cls(
                name=str(data["name"]),
                created=float(data["created"]),
                fingerprint=BuildFingerprint.from_json(data["fingerprint"]),
                origins={str(k): str(v) for k, v in dict(data["origins"]).items()},
                files=files,
                skipped=[str(s) for s in data.get("skipped", [])],
                tool_version=str(data.get("tool_version", "")),
                schema=str(data["schema"]),
                warm_records=_dicts(data.get("warm_records")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ArchiveError(f"the manifest is malformed ({type(exc).__name__}: {exc})") from exc
        if len(manifest.by_path()) != len(files):
            raise ArchiveError("the manifest lists a file twice")
        for entry in files:
            if entry.size < 0 or len(entry.sha256) != 64:
                raise ArchiveError(f"the manifest entry for {entry.path!r} has a bad size or sha256")
        return manifest


def _dicts(value: Any) -> list[dict[str, Any]]:
    """The carried warm-up records: a list of objects, or nothing (each is validated when adopted)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def marker_bytes(
    fingerprint: BuildFingerprint, origin: str, snapshot: str | None, restore_id: str | None
) -> bytes:
    """The marker file we leave in a cache folder: which build it holds, and where it came from."""
    data = {
        "schema": MARKER_SCHEMA,
        "fingerprint": fingerprint.to_json(),
        "origin": origin,
        "snapshot": snapshot,
        "restore_id": restore_id,
    }
    return json.dumps(data, indent=1).encode()


def read_marker(raw: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and data.get("schema") == MARKER_SCHEMA else None
