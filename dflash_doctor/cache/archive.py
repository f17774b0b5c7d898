"""Snapshot archives: a tar stream, zstd-compressed on all cores, the manifest as its first member.

Writing hashes every file first (threads: hashlib releases the GIL), writes the manifest, then the
files; a file replaced between the two passes is caught by comparing its stat, never archived with
a stale hash. Reading is one streaming pass that trusts nothing: each member is checked against the
manifest (name, type, size) before a byte is written, and against its sha256 after.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

import zstandard

from dflash_doctor.cache.locations import TRANSIENT_FOLDERS
from dflash_doctor.cache.manifest import MANIFEST_MEMBER, MARKER_NAME, ArchiveError, CacheManifest, FileEntry
from dflash_doctor.file_hashes import sha256_of

CHUNK = 1 << 20
TAR_BUFFER = 64 << 10
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


@dataclass(frozen=True)
class ReadLimits:
    """Refuse archives that would fill the disk or the memory before their hashes could be checked."""

    max_member_bytes: int = 16 << 30
    max_total_bytes: int = 512 << 30
    max_manifest_bytes: int = 256 << 20
    max_members: int = 2_000_000


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
    compressor = zstandard.ZstdCompressor(level=level, threads=threads)
    try:
        with open(partial, "wb") as raw:
            with (
                compressor.stream_writer(raw, closefd=False) as zwriter,
                tarfile.open(fileobj=zwriter, mode="w|", format=tarfile.PAX_FORMAT) as tar,
            ):
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


# ---------------------------------------------------------------- reading


def _open_stream(path: Path) -> tuple[BinaryIO, tarfile.TarFile]:
    raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_size=CHUNK, closefd=True)
        # A small tar buffer: stream mode slices its buffer on every read, so 1 MiB costs ~25% of a restore.
        tar = tarfile.open(fileobj=reader, mode="r|", bufsize=TAR_BUFFER)  # noqa: SIM115 - closed by the caller
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as exc:
        raw.close()
        raise ArchiveError(f"{path}: truncated or corrupt archive, or not a snapshot ({exc})") from exc
    return raw, tar


def _read_manifest_member(tar: tarfile.TarFile, path: Path, limits: ReadLimits) -> CacheManifest:
    try:
        first = tar.next()
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as exc:
        raise ArchiveError(f"{path}: truncated or corrupt archive ({exc})") from exc
    if first is None or first.name != MANIFEST_MEMBER or not first.isreg():
        raise ArchiveError(f"{path}: the first member is not {MANIFEST_MEMBER}: not a dflash-doctor snapshot")
    if first.size > limits.max_manifest_bytes:
        raise ArchiveError(
            f"{path}: the manifest is {first.size} bytes, over the {limits.max_manifest_bytes} limit"
        )
    handle = tar.extractfile(first)
    assert handle is not None
    try:
        raw = handle.read()
    except (tarfile.TarError, zstandard.ZstdError, EOFError, OSError) as exc:
        raise ArchiveError(f"{path}: truncated or corrupt archive ({exc})") from exc
    return CacheManifest.from_bytes(raw)


def read_manifest(path: Path, limits: ReadLimits | None = None) -> CacheManifest:
    """Only the manifest (decompresses the first few KB, not the archive)."""
    raw, tar = _open_stream(path)
    try:
        return _read_manifest_member(tar, path, limits or ReadLimits())
    finally:
        tar.close()
        raw.close()


def check_member_name(name: str, roots: set[str]) -> PurePosixPath:
    """A member's path, or ArchiveError when it is absolute, climbs with `..`, or leaves every root."""
    if "\x00" in name or not name:
        raise ArchiveError(f"member {name!r}: empty name or NUL byte")
    if name.startswith("/"):
        raise ArchiveError(f"member {name!r}: absolute path (only paths inside the cache tree are accepted)")
    parts = name.rstrip("/").split("/")
    if ".." in parts:
        raise ArchiveError(f"member {name!r}: `..` in the path would climb out of the cache tree")
    if any(part in ("", ".") for part in parts):
        raise ArchiveError(f"member {name!r}: not a clean relative path")
    if parts[0] not in roots:
        raise ArchiveError(f"member {name!r}: outside the archive's roots ({', '.join(sorted(roots))})")
    return PurePosixPath(*parts)


def _refuse_special(member: tarfile.TarInfo, roots: set[str]) -> None:
    name = member.name
    if member.issym() or member.islnk():
        kind = "symlink" if member.issym() else "hardlink"
        target = member.linkname
        base = PurePosixPath(name).parent if member.issym() else PurePosixPath()
        resolved = os.path.normpath(str(base / target)) if not target.startswith("/") else target
        top = resolved.split("/")[0]
        if target.startswith("/") or resolved.startswith("..") or top not in roots:
            raise ArchiveError(f"member {name!r}: {kind} to {target!r} points outside the cache tree")
        raise ArchiveError(
            f"member {name!r}: {kind} to {target!r}: only regular files and folders are accepted"
        )
    if member.ischr() or member.isblk():
        raise ArchiveError(f"member {name!r}: device file (only regular files and folders are accepted)")
    if member.isfifo():
        raise ArchiveError(f"member {name!r}: fifo (only regular files and folders are accepted)")
    if not (member.isreg() or member.isdir()):
        raise ArchiveError(f"member {name!r}: unsupported member type {member.type!r}")


def _within(root: Path, rel: PurePosixPath) -> Path:
    target = root.joinpath(*rel.parts)
    if os.path.commonpath([root, target]) != str(root):
        raise ArchiveError(f"member {rel}: resolves outside {root}")
    return target


_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def extract_verified(
    path: Path,
    destinations: dict[str, Path],
    limits: ReadLimits | None = None,
    accept: Callable[[CacheManifest], None] | None = None,
    on_file: Callable[[str], None] | None = None,
) -> CacheManifest:
    """Stream the archive into `destinations` (root label -> an empty folder we own), verifying all.

    `accept(manifest)` runs after the manifest is read and before any file is written: it may refuse
    (fingerprint mismatch, not enough room) by raising. Raises ArchiveError on the first defect; the
    caller owns the destinations and removes them on failure.
    """
    limits = limits or ReadLimits()
    raw, tar = _open_stream(path)
    try:
        manifest = _read_manifest_member(tar, path, limits)
        if accept is not None:
            accept(manifest)
        roots = set(manifest.origins)
        missing_roots = roots - set(destinations)
        if missing_roots:
            raise ArchiveError(
                f"{path}: no destination for archive root(s) {', '.join(sorted(missing_roots))}"
            )
        expected = manifest.by_path()
        if manifest.total_bytes > limits.max_total_bytes:
            raise ArchiveError(
                f"{path}: {manifest.total_bytes} bytes in all, over the {limits.max_total_bytes} limit"
            )
        seen: set[str] = set()
        made_dirs: set[Path] = set()
        for count, member in enumerate(_members(tar, path), start=1):
            if count > limits.max_members:
                raise ArchiveError(f"{path}: more than {limits.max_members} members")
            rel = check_member_name(member.name, roots)
            _refuse_special(member, roots)
            root = destinations[rel.parts[0]]
            inner = PurePosixPath(*rel.parts[1:]) if len(rel.parts) > 1 else PurePosixPath()
            target = _within(root, inner)
            if member.isdir():
                _make_dirs(target, made_dirs)
                continue
            key = str(rel)
            entry = expected.get(key)
            if entry is None:
                raise ArchiveError(
                    f"member {key!r} is not in the manifest: the manifest does not match the members"
                )
            if key in seen:
                raise ArchiveError(f"member {key!r} appears twice")
            if member.size > limits.max_member_bytes:
                raise ArchiveError(
                    f"member {key!r} is oversized: {member.size} bytes, over the {limits.max_member_bytes} limit"
                )
            if member.size != entry.size:
                raise ArchiveError(
                    f"member {key!r} is {member.size} bytes but the manifest says {entry.size}: "
                    "the manifest does not match the members"
                )
            seen.add(key)
            _make_dirs(target.parent, made_dirs)
            _write_member(tar, member, target, entry, path)
            if on_file is not None:
                on_file(key)
        absent = sorted(set(expected) - seen)
        if absent:
            raise ArchiveError(
                f"the manifest lists {len(absent)} file(s) the archive does not hold (first: {absent[0]}): "
                "the manifest does not match the members"
            )
        return manifest
    finally:
        tar.close()
        raw.close()


def _members(tar: tarfile.TarFile, path: Path) -> Iterator[tarfile.TarInfo]:
    while True:
        try:
            member = tar.next()
        except (tarfile.TarError, zstandard.ZstdError, EOFError) as exc:
            raise ArchiveError(f"{path}: truncated or corrupt archive ({exc})") from exc
        if member is None:
            return
        yield member


def _make_dirs(folder: Path, made: set[Path]) -> None:
    if folder in made:
        return
    folder.mkdir(mode=0o755, parents=True, exist_ok=True)
    made.add(folder)


def _write_member(
    tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, entry: FileEntry, path: Path
) -> None:
    source = tar.extractfile(member)
    assert source is not None
    digest = hashlib.sha256()
    fd = os.open(target, _WRITE_FLAGS, 0o600)
    try:
        remaining = member.size
        while remaining > 0:
            try:
                chunk = source.read(min(CHUNK, remaining))
            except (tarfile.TarError, zstandard.ZstdError, EOFError, OSError) as exc:
                raise ArchiveError(f"{path}: truncated or corrupt archive at {entry.path} ({exc})") from exc
            if not chunk:
                raise ArchiveError(f"{path}: truncated archive: {entry.path} ends early")
            digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
            remaining -= len(chunk)
        os.fchmod(fd, entry.mode & 0o755)  # never setuid, never group/world-writable
    finally:
        os.close(fd)
    if digest.hexdigest() != entry.sha256:
        raise ArchiveError(
            f"member {entry.path!r}: sha256 {digest.hexdigest()[:16]}… does not match the manifest's {entry.sha256[:16]}…"
        )
    os.utime(target, (time.time(), entry.mtime))
