"""Snapshot archives: a tar stream, the manifest as its first member, compressed on all cores as
independent zstd frames of 2 MiB with a seek table at the end (frames.py; still one ordinary .zst).

Writing hashes every file first (threads: hashlib releases the GIL), writes the manifest, then the
files; a file replaced between the two passes is caught by comparing its stat, never archived with
a stale hash. Reading is in `extract` (re-exported here): one streaming pass that trusts nothing.
"""

from __future__ import annotations

import os
import stat
import tarfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from dflash_doctor.cache.extract import ReadLimits, extract_verified, read_manifest
from dflash_doctor.cache.frames import FramedWriter
from dflash_doctor.cache.locations import TRANSIENT_FOLDERS
from dflash_doctor.cache.manifest import MANIFEST_MEMBER, MARKER_NAME, ArchiveError, CacheManifest, FileEntry
from dflash_doctor.file_hashes import sha256_of

__all__ = [
    "ARCHIVE_SUFFIX",
    "ReadLimits",
    "SourceFile",
    "collect_files",
    "extract_verified",
    "hash_files",
    "read_manifest",
    "write_archive",
]

ARCHIVE_SUFFIX = ".tar.zst"


@dataclass(frozen=True)
class SourceFile:
    """A file to archive: where it is, its archive path, and the stat we hashed it under."""

    archive_path: str
    path: Path
    size: int
    mode: int
    mtime: float
    identity: tuple[int, int, int]  # (inode, size, mtime_ns): changes when the file is replaced


def collect_files(roots: dict[str, Path]) -> tuple[list[SourceFile], list[str]]:
    """Every regular file under each root (transient folders and our marker left out).

    Returns (files, skipped): links and special files are skipped and named, never followed.
    """
    files: list[SourceFile] = []
    skipped: list[str] = []
    for label, root in roots.items():
        if not root.is_dir():
            continue
        for folder, dirnames, filenames in os.walk(root):
            rel_folder = os.path.relpath(folder, root)
            if rel_folder == ".":
                dirnames[:] = [d for d in dirnames if d not in TRANSIENT_FOLDERS]
            for name in sorted(dirnames):
                if os.path.islink(os.path.join(folder, name)):
                    skipped.append(_archive_path(label, rel_folder, name))
            dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(folder, d)))
            for name in sorted(filenames):
                if rel_folder == "." and name == MARKER_NAME:
                    continue
                full = os.path.join(folder, name)
                info = os.lstat(full)
                archive_path = _archive_path(label, rel_folder, name)
                if not stat.S_ISREG(info.st_mode):
                    skipped.append(archive_path)
                    continue
                files.append(
                    SourceFile(
                        archive_path,
                        Path(full),
                        info.st_size,
                        stat.S_IMODE(info.st_mode),
                        info.st_mtime,
                        (info.st_ino, info.st_size, info.st_mtime_ns),
                    )
                )
    return files, skipped


def _archive_path(label: str, rel_folder: str, name: str) -> str:
    return (
        str(PurePosixPath(label) / name) if rel_folder == "." else str(PurePosixPath(label, rel_folder, name))
    )


def hash_files(files: list[SourceFile], threads: int | None = None) -> list[FileEntry]:
    """Manifest entries for these files, hashed in parallel."""
    workers = threads or min(8, (os.cpu_count() or 1) + 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        digests = list(pool.map(lambda f: sha256_of(str(f.path)), files, chunksize=16))
    return [
        FileEntry(f.archive_path, f.size, d, f.mode, f.mtime) for f, d in zip(files, digests, strict=True)
    ]


def _tarinfo(name: str, size: int, mode: int, mtime: float) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.type = size, mode, int(mtime), tarfile.REGTYPE
    return info


def write_archive(
    dest: Path, manifest: CacheManifest, files: list[SourceFile], level: int = 3, threads: int = -1
) -> int:
    """Write the archive beside `dest`, then rename it into place. Returns its size in bytes."""
    partial = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    by_path = manifest.by_path()
    try:
        with open(partial, "wb") as raw, FramedWriter(raw, level=level, threads=threads) as zwriter:
            with tarfile.open(fileobj=zwriter, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                manifest_bytes = manifest.to_bytes()
                tar.addfile(
                    _tarinfo(MANIFEST_MEMBER, len(manifest_bytes), 0o644, manifest.created),
                    _BytesReader(manifest_bytes),
                )
                for source in files:
                    entry = by_path[source.archive_path]
                    with open(source.path, "rb") as handle:
                        now = os.fstat(handle.fileno())
                        if (now.st_ino, now.st_size, now.st_mtime_ns) != source.identity:
                            raise ArchiveError(
                                f"{source.path} changed while the snapshot was being written",
                                hint="run the snapshot again when no compile is running",
                            )
                        tar.addfile(_tarinfo(entry.path, entry.size, entry.mode, entry.mtime), handle)
            zwriter.close()  # the last frame and the seek table
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(partial, dest)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return dest.stat().st_size


class _BytesReader:
    """The minimal file object tarfile.addfile reads from."""

    def __init__(self, data: bytes) -> None:
        self._data, self._pos = data, 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size < 0 else self._pos + size
        chunk, self._pos = self._data[self._pos : end], min(end, len(self._data))
        return chunk
