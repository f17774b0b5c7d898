"""The snapshot store: a folder of `<name>.tar.zst` archives, one lock, list and prune.

Every operation that writes to the store or to a cache folder takes the store's lock, so a snapshot,
a restore and a prune never interleave, across processes too (filelock: a POSIX `flock`).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import filelock

from dflash_doctor.cache.archive import ARCHIVE_SUFFIX, read_manifest
from dflash_doctor.cache.fingerprint import BuildFingerprint, incompatibilities
from dflash_doctor.cache.manifest import ArchiveError, CacheManifest
from dflash_doctor.errors import DoctorError

LOCK_NAME = ".store.lock"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True)
class SnapshotInfo:
    """One archive in the store, with its manifest (None when the archive is unreadable)."""

    name: str
    path: Path
    size_bytes: int
    manifest: CacheManifest | None
    error: str | None = None

    @property
    def created(self) -> float:
        return self.manifest.created if self.manifest else os.stat(self.path).st_mtime

    def incompatible_with(self, current: BuildFingerprint) -> list[str]:
        if self.manifest is None:
            return [f"unreadable: {self.error}"]
        return incompatibilities(self.manifest.fingerprint, current)


def check_name(name: str) -> str:
    if not _NAME.match(name) or name.endswith(ARCHIVE_SUFFIX):
        raise DoctorError(
            f"snapshot name {name!r} is not usable",
            hint="use letters, digits, '.', '_', '+', '-' (up to 128), without the .tar.zst suffix",
        )
    return name


def default_name(fingerprint: BuildFingerprint, now: float) -> str:
    """`torch2.11.0+cu130-h200-20261130-001036`: what it is for and when, readable in `cache list`."""
    gpu = fingerprint.gpu_names[0] if fingerprint.gpu_names else "cpu"
    gpu = re.sub(r"[^a-z0-9]+", "", gpu.lower().replace("nvidia", "")) or "gpu"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    version = re.sub(r"[^A-Za-z0-9.+]", "", fingerprint.torch_version or "notorch")
    return f"torch{version}-{gpu}-{stamp}"


def parse_duration(text: str) -> float:
    """`7d`, `12h`, `30m`, `2w`, `90s` -> seconds."""
    match = _DURATION.match(text.strip().lower())
    if not match:
        raise DoctorError(
            f"duration {text!r} is not understood", hint="use a number and a unit: 90s, 30m, 12h, 7d, 2w"
        )
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def choose_prunable(
    snapshots: list[SnapshotInfo], keep: int | None, older_than: float | None, now: float
) -> list[SnapshotInfo]:
    """Which snapshots to delete: beyond the newest `keep`, and/or created more than `older_than` ago.

    With both given, a snapshot goes only when both say so (keep protects the newest N regardless).
    """
    if keep is None and older_than is None:
        return []
    newest_first = sorted(snapshots, key=lambda s: s.created, reverse=True)
    doomed = []
    for rank, snap in enumerate(newest_first):
        beyond_keep = keep is None or rank >= keep
        too_old = older_than is None or now - snap.created > older_than
        if beyond_keep and too_old:
            doomed.append(snap)
    return doomed


class SnapshotStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    @contextmanager
    def locked(self, timeout: float = 600.0) -> Iterator[None]:
        """Hold the store lock; a clear error, not a hang, when another operation holds it too long."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = filelock.FileLock(str(self.root / LOCK_NAME), timeout=timeout)
        try:
            with lock:
                yield
        except filelock.Timeout as exc:
            raise DoctorError(
                f"another dflash-doctor cache operation holds {self.root / LOCK_NAME}",
                hint="wait for it to finish, then try again",
            ) from exc

    def path_for(self, name: str) -> Path:
        return self.root / f"{check_name(name)}{ARCHIVE_SUFFIX}"

    def resolve(self, name_or_path: str) -> Path:
        """A snapshot name in the store, or a path to an archive anywhere."""
        candidate = Path(name_or_path).expanduser()
        if name_or_path.endswith(ARCHIVE_SUFFIX) or os.sep in name_or_path:
            if candidate.is_file():
                return candidate
            raise DoctorError(f"{name_or_path}: no such archive")
        path = self.path_for(name_or_path)
        if not path.is_file():
            raise DoctorError(
                f"no snapshot named {name_or_path!r} in {self.root}", hint="see `dflash-doctor cache list`"
            )
        return path

    def snapshots(self) -> list[SnapshotInfo]:
        """Every archive in the store, newest first; unreadable ones are listed with their error."""
        if not self.root.is_dir():
            return []
        found = []
        for path in self.root.glob(f"*{ARCHIVE_SUFFIX}"):
            if path.name.startswith("."):
                continue  # a partial write in progress or left by a crash
            name = path.name[: -len(ARCHIVE_SUFFIX)]
            try:
                found.append(SnapshotInfo(name, path, path.stat().st_size, read_manifest(path)))
            except ArchiveError as exc:
                found.append(SnapshotInfo(name, path, path.stat().st_size, None, exc.message))
            except OSError as exc:
                found.append(SnapshotInfo(name, path, 0, None, str(exc)))
        return sorted(found, key=lambda s: s.created, reverse=True)

    def compatible(self, current: BuildFingerprint) -> list[SnapshotInfo]:
        return [s for s in self.snapshots() if not s.incompatible_with(current)]

    def remove_partials(self) -> list[Path]:
        """Archives a crashed snapshot left half-written (never visible under their final name)."""
        removed = []
        for path in self.root.glob(f".*{ARCHIVE_SUFFIX}.partial-*"):
            path.unlink(missing_ok=True)
            removed.append(path)
        return removed
