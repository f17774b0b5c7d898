"""Take a snapshot: hash every file of the cache folders, then write one verified-on-read archive."""

from __future__ import annotations

import os
import stat
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from dflash_base.errors import DoctorError
from dflash_doctor import __version__
from dflash_doctor.cache.archive import (
    ARCHIVE_SUFFIX,
    collect_files,
    hash_files,
    write_archive,
)
from dflash_doctor.cache.backups import remove_torn_records_at
from dflash_doctor.cache.fingerprint import BuildFingerprint
from dflash_doctor.cache.folder_lock import TIMEOUT_S, folder_locks
from dflash_doctor.cache.fsops import fd_path, kind_of, read_only, write_atomic_at
from dflash_doctor.cache.layout import examine
from dflash_doctor.cache.locations import check_apart
from dflash_doctor.cache.manifest import MARKER_NAME, CacheManifest, marker_bytes
from dflash_doctor.cache.parent_dir import ParentDir
from dflash_doctor.cache.recovery import recover_interrupted
from dflash_doctor.cache.restore import name_paths
from dflash_doctor.cache.warm_record import WarmRecords


@dataclass(frozen=True)
class SnapshotResult:
    path: Path
    manifest: CacheManifest
    archive_bytes: int
    seconds: float
    unmarked: tuple[str, ...] = ()  # roots on a read-only file system: read, but no marker written


def archive_destination(store_root: Path, name: str, out: Path | None) -> Path:
    """`--out` names a folder to put `<name>.tar.zst` in, or the archive file itself: a new path ending
    in `.tar.zst`. Never another name than the one given (no `/dev/null.tar.zst`), never over a file."""
    if out is None:
        dest = store_root / f"{name}{ARCHIVE_SUFFIX}"
    elif out.is_dir():
        dest = out / f"{name}{ARCHIVE_SUFFIX}"
    elif os.path.lexists(out):
        raise DoctorError(
            f"--out {out} already exists and is not a folder: a snapshot never overwrites a file",
            hint=f"give a folder, or a new file name ending in {ARCHIVE_SUFFIX}",
        )
    elif not out.name.endswith(ARCHIVE_SUFFIX):
        raise DoctorError(
            f"--out {out}: an archive's name must end in {ARCHIVE_SUFFIX}",
            hint=f"--out {out.with_name(out.name + ARCHIVE_SUFFIX)}, or a folder to put {name}{ARCHIVE_SUFFIX} in",
        )
    else:
        dest = out
    if os.path.lexists(dest):
        raise DoctorError(f"{dest} already exists", hint="choose another --name, or prune the old one first")
    if not dest.parent.is_dir():
        raise DoctorError(f"--out: folder {dest.parent} does not exist")
    if read_only(dest.parent):  # a prebuilt store on a read-only mount (issue 37, B7)
        raise DoctorError(
            f"{dest.parent} is on a read-only file system: a snapshot cannot be written there; nothing was "
            "written",
            hint="give --out a folder on a writable disk, or set DFLASH_DOCTOR_HOME to one "
            "(a read-only store still serves `cache list` and `cache restore`)",
        )
    if not os.access(dest.parent, os.W_OK | os.X_OK):
        raise DoctorError(f"--out: folder {dest.parent} is not writable by you")
    return dest


def take_snapshot(
    roots: dict[str, Path],
    fingerprint: BuildFingerprint,
    name: str,
    dest: Path,
    level: int = 3,
    now: float | None = None,
    records: WarmRecords | None = None,
    lock_timeout: float = TIMEOUT_S,
) -> SnapshotResult:
    """Archive the cache folders `roots` (label -> folder) to `dest`, holding each folder's lock (a
    restore from any home waits); an interrupted restore is finished first, so a half-swapped pair of
    roots is never archived. The caller holds the store lock when `dest` is in the store.

    Refused, before anything is read or written: nested roots, a parent folder others could change
    (parent_dir.py), a root that is not a folder or not a compile cache by its content (layout.py).
    Each root is read, and our marker written, through a handle of it.

    `records`: the warm-up records to carry, those whose files the snapshot holds (warm_record.py)."""
    check_apart(roots)
    with folder_locks(roots.values(), lock_timeout) as parents, ExitStack() as stack:
        for path in roots.values():
            recover_interrupted(path, parents[path])
        opened: dict[str, int] = {}
        strays: dict[str, list[str]] = {}
        for label, path in roots.items():
            found = _open_root(parents[path], path)
            if found is not None:
                stack.callback(os.close, found[0])
                opened[label], strays[label] = found
        return _snapshot_locked(roots, opened, strays, fingerprint, name, dest, level, now, records)


def _open_root(parent: ParentDir, path: Path) -> tuple[int, list[str]] | None:
    """A handle of the cache folder `path` (None when absent), once it proved a compile cache, and the
    few strays in it that the snapshot leaves out."""
    info = parent.lstat(path.name)
    if info is None:
        return None
    if not stat.S_ISDIR(info.st_mode):
        raise DoctorError(
            f"{path} is a {kind_of(info.st_mode)}, not a folder: a snapshot reads a cache folder itself",
            hint="point TORCHINDUCTOR_CACHE_DIR (and TRITON_CACHE_DIR) at the compile cache folders",
        )
    fd = parent.open_folder(path.name)
    try:
        if os.fstat(fd).st_uid == os.getuid():
            remove_torn_records_at(fd)
        content = examine(fd)
        reason = content.reason
    except BaseException:
        os.close(fd)
        raise
    if reason is not None:
        os.close(fd)
        raise DoctorError(
            f"{path} does not look like a compile cache: {reason}. A snapshot archives only a compile "
            "cache; nothing was written",
            hint="point TORCHINDUCTOR_CACHE_DIR (and TRITON_CACHE_DIR) at the compile cache folders",
        )
    return fd, content.strangers


def _snapshot_locked(
    roots: dict[str, Path],
    opened: dict[str, int],
    strays: dict[str, list[str]],
    fingerprint: BuildFingerprint,
    name: str,
    dest: Path,
    level: int,
    now: float | None,
    records: WarmRecords | None,
) -> SnapshotResult:
    start = time.perf_counter()
    through = {label: fd_path(fd) for label, fd in opened.items()}  # reads go through the handles
    reading = {label: Path(through[label] or roots[label]) for label in opened}
    fd_paths = {str(reading[label]): str(roots[label]) for label in opened if through[label]}
    try:
        files, skipped = collect_files(reading, strays)
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
            origins={label: str(roots[label]) for label in opened},
            files=hashed,
            skipped=skipped,
            tool_version=__version__,
            warm_records=records.covered_by({f.path: f.size for f in hashed}) if records else [],
        )
        size = write_archive(dest, manifest, files, level=level)
    except DoctorError as exc:
        name_paths(exc, fd_paths)
        raise
    unmarked = []
    for label, fd in opened.items():
        if read_only(fd):  # a prebuilt cache on a read-only mount: archived, its marker cannot be written
            unmarked.append(str(roots[label]))
        elif os.fstat(fd).st_uid == os.getuid():
            write_atomic_at(fd, MARKER_NAME, marker_bytes(fingerprint, str(roots[label]), name, None))
    return SnapshotResult(dest, manifest, size, time.perf_counter() - start, tuple(unmarked))
