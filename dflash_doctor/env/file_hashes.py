"""sha256 of installed files, remembered across runs so a warm `check` only stats them.

CUDA libraries weigh gigabytes; hashing them on every run would take seconds. A file's digest is kept
under the key (path, size, mtime_ns, inode, ctime_ns): pip replaces files by writing a new one and
renaming it (new inode), and any in-place write moves mtime and ctime, so a stale digest is never served.
The cache is one JSON file written atomically; a corrupt or foreign file is treated as empty.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from dflash_base.atomic import write_json_atomic
from dflash_doctor.paths import cache_root

CACHE_DIR_ENV = "DFLASH_DOCTOR_CACHE_DIR"
CACHE_FILE = "file-hashes.json"
SCHEMA = "dflash-doctor/file-hashes/v1"
MAX_ENTRIES = 50_000  # far more than one environment's libraries; bounds the file if many venvs are audited

StatKey = tuple[int, int, int, int]  # size, mtime_ns, inode, ctime_ns


def default_cache_path() -> Path:
    """`$DFLASH_DOCTOR_CACHE_DIR/file-hashes.json`, else under the tool's cache root."""
    folder = os.environ.get(CACHE_DIR_ENV)
    return (Path(folder).expanduser() if folder else cache_root()) / CACHE_FILE


def stat_key(st: os.stat_result) -> StatKey:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(1 << 20)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while read := handle.readinto(buffer):
            digest.update(view[:read])
    return digest.hexdigest()


@dataclass
class HashCache:
    """Digests of files by path, valid only while the file's stat key is unchanged."""

    path: Path | None = None
    entries: dict[str, tuple[StatKey, str]] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0
    bytes_hashed: int = 0
    _dirty: bool = False

    @classmethod
    def load(cls, path: Path | None = None) -> HashCache:
        """Read the cache file; anything unreadable or malformed starts an empty cache."""
        where = path or default_cache_path()
        cache = cls(where)
        try:
            raw = json.loads(where.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return cache
        if not isinstance(raw, dict) or raw.get("schema") != SCHEMA or not isinstance(raw.get("files"), dict):
            return cache
        for file_path, row in raw["files"].items():
            if _valid_row(row):
                cache.entries[file_path] = (tuple(row[:4]), row[4])
        return cache

    def digest(self, path: str) -> str | None:
        """sha256 hex of `path`, from the cache when its stat key still matches; None if unreadable."""
        try:
            key = stat_key(os.stat(path))
        except OSError:
            return None
        known = self.entries.get(path)
        if known is not None and known[0] == key:
            self.hits += 1
            return known[1]
        try:
            value = sha256_of(path)
        except OSError:
            return None
        self.misses += 1
        self.bytes_hashed += key[0]
        self.entries.pop(path, None)  # re-insert at the end: the newest rows survive the size bound
        self.entries[path] = (key, value)
        self._dirty = True
        return value

    def save(self) -> None:
        """Write atomically if anything changed; a read-only cache folder is not an error."""
        if not self._dirty or self.path is None:
            return
        rows = list(self.entries.items())[-MAX_ENTRIES:]
        data = {"schema": SCHEMA, "files": {p: [*key, value] for p, (key, value) in rows}}
        try:
            write_json_atomic(self.path, data)
        except OSError:
            return
        self._dirty = False


def _valid_row(row: object) -> bool:
    return (
        isinstance(row, list)
        and len(row) == 5
        and all(isinstance(v, int) for v in row[:4])
        and isinstance(row[4], str)
        and len(row[4]) == 64
    )
