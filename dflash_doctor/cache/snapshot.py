"""Take a snapshot: hash every file of the cache folders, then write one verified-on-read archive."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from dflash_doctor import __version__
from dflash_doctor.atomic import write_bytes_atomic
from dflash_doctor.cache.archive import ARCHIVE_SUFFIX, collect_files, hash_files, write_archive
from dflash_doctor.cache.fingerprint import BuildFingerprint
from dflash_doctor.cache.manifest import MARKER_NAME, CacheManifest, marker_bytes
from dflash_doctor.cache.warm_record import WarmRecords
from dflash_doctor.errors import DoctorError


@dataclass(frozen=True)
class SnapshotResult:
    path: Path
    manifest: CacheManifest
    archive_bytes: int
    seconds: float


def write_marker(folder: Path, fingerprint: BuildFingerprint, origin: str, snapshot: str | None) -> None:
    """Record in the cache folder which build it holds (atomically: beside, then rename)."""
    write_bytes_atomic(folder / MARKER_NAME, marker_bytes(fingerprint, origin, snapshot, None))


def archive_destination(store_root: Path, name: str, out: Path | None) -> Path:
    """`--out` may name the archive file or a folder to put `<name>.tar.zst` in."""
    if out is None:
        dest = store_root / f"{name}{ARCHIVE_SUFFIX}"
    elif out.is_dir():
        dest = out / f"{name}{ARCHIVE_SUFFIX}"
    else:
        dest = out if out.name.endswith(ARCHIVE_SUFFIX) else out.with_name(out.name + ARCHIVE_SUFFIX)
    if dest.exists():
        raise DoctorError(f"{dest} already exists", hint="choose another --name, or prune the old one first")
    if not dest.parent.is_dir():
        raise DoctorError(f"--out: folder {dest.parent} does not exist")
    return dest


def take_snapshot(
    roots: dict[str, Path],
    fingerprint: BuildFingerprint,
    name: str,
    dest: Path,
    level: int = 3,
    now: float | None = None,
    records: WarmRecords | None = None,
) -> SnapshotResult:
    """Archive the cache folders `roots` (label -> folder) to `dest`. The caller holds the store lock.

    `records`: the warm-up records to carry, those whose files the snapshot holds (warm_record.py)."""
    start = time.perf_counter()
    files, skipped = collect_files(roots)
    if not files:
        where = ", ".join(str(p) for p in roots.values())
        raise DoctorError(
            f"nothing to snapshot: no cache files in {where}",
            hint="compile something first, or run `dflash-doctor cache warm`",
        )
    hashed = hash_files(files)
    manifest = CacheManifest(
        name=name,
        created=now if now is not None else time.time(),
        fingerprint=fingerprint,
        origins={label: str(path) for label, path in roots.items() if path.is_dir()},
        files=hashed,
        skipped=skipped,
        tool_version=__version__,
        warm_records=records.covered_by({f.path: f.size for f in hashed}) if records else [],
    )
    size = write_archive(dest, manifest, files, level=level)
    for path in roots.values():
        if path.is_dir() and os.access(path, os.W_OK):
            write_marker(path, fingerprint, str(path), name)
    return SnapshotResult(dest, manifest, size, time.perf_counter() - start)
