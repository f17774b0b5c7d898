"""Reading a snapshot back: one streaming pass that trusts nothing, on three threads.

The manifest (the first member) is read and handed to `accept` and `destinations` before anything
is written. Then:
- a decompress thread stays a few blocks ahead: a framed archive's frames decompressed one-shot
  (frames.FrameBlocks, the GIL released), a v1 archive's single stream into reused 1 MiB buffers;
- the calling thread parses each tar header (tarstream), checks a batch of members against the
  archive's rules and the manifest (name, type, size, listed once) before writing a byte of them,
  then writes them: memoryview slices of the decompressed blocks, one open/write/utime/close per file;
- a hash thread computes the sha256 of each written member that lay in one block and compares it with the
  manifest's (when it falls behind, the calling thread hashes a batch itself); a larger member is hashed by
  the calling thread as its pieces are written, so memory stays bounded whatever a member's size.
zstd's one-shot decompress, sha256 and the file syscalls release the GIL, so on two cores the three
overlap: 346 MB / 9112 files, one thread doing everything 0.62-0.68 s, these three 0.39-0.42 s.

A sha256 mismatch stops the writing at the next batch and is raised before `extract_verified`
returns: the caller never swaps in a folder holding a file that does not match. Any refusal stops
all threads and raises ArchiveError; the caller owns the destination folders and removes them.
`threaded=False` does all of it in the calling thread, each member verified before it is written.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import zstandard

from dflash_base.errors import DoctorError
from dflash_doctor.cache.frames import FrameBlocks, read_seek_table, walk_frames
from dflash_doctor.cache.fsops import open_regular, printable
from dflash_doctor.cache.manifest import (
    BACKUP_OWNER_NAME,
    MANIFEST_MEMBER,
    MANIFEST_SCHEMA,
    MARKER_NAME,
    MAX_DEPTH,
    ArchiveError,
    CacheManifest,
)
from dflash_doctor.cache.tarstream import (
    BLOCK_TYPE,
    CHAR_TYPE,
    FIFO_TYPE,
    HARDLINK_TYPE,
    REGULAR_TYPES,
    SYMLINK_TYPE,
    Member,
    TarReader,
)

# Sizes measured on 346 MB / 9112 files, 2 cores. A framed archive's blocks are its 2 MiB frames;
# a v1 stream was cut into 1 MiB blocks (0.39 s against 0.41 s for 4 MiB, and a quarter of the memory).
# Batches: the calling thread checks a batch of members (Python, holding the GIL), then writes them
# (syscalls, releasing it): 0.5-2 MiB batches measured alike, 256 KiB slower, one member at a time
# (checks and writes interleaved) 0.03-0.04 s slower: more GIL hand-offs to the other threads.
READ_SIZE = 1 << 20  # compressed bytes per read from the file (v1 stream)
BLOCK_BYTES = 1 << 20  # decompressed bytes per block handed to the tar reader (v1 stream)
BATCH_BYTES = 1 << 20  # file bytes per batch of write operations
BLOCKS_AHEAD = 3  # decompressed blocks queued for the calling thread
BATCHES_TO_HASH = 3  # written batches queued for the hash thread

_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

_RESERVED = frozenset({MARKER_NAME, BACKUP_OWNER_NAME})

# Write operations: a batch of them produced by _plan, then carried out by _execute (one thread).
_MKDIRS, _FILE, _OPEN, _PIECE, _CLOSE = range(5)


@dataclass(frozen=True)
class ReadLimits:
    """Refuse archives that would fill the disk or the memory before their hashes could be checked."""

    max_member_bytes: int = 16 << 30
    max_total_bytes: int = 512 << 30
    max_manifest_bytes: int = 256 << 20
    max_members: int = 2_000_000
    # What the manifest may declare against the archive's size: a real cache compresses 2-10x (346 MB of
    # sources, .so and cubin-like files: 2.7x); a 0.05 MB archive declaring a 1 GiB member is a bomb whose sha256
    # fails only once all of it is written. 1000x let a 17 MB archive declare 16 GiB (issue 58, H1).
    max_expansion: int = 100
    expansion_slack_bytes: int = 64 << 20

    def check_expansion(self, declared: int, archive_bytes: int, where: str) -> None:
        if declared > archive_bytes * self.max_expansion + self.expansion_slack_bytes:
            raise ArchiveError(
                f"{where}: the manifest declares {declared} bytes for an archive of {archive_bytes}: "
                f"more than {self.max_expansion}x, not a compile cache"
            )


class _Blocks:
    """The decompressed stream in blocks of BLOCK_BYTES (the last one shorter): views of a few
    reused buffers, each refilled only once nothing holds a view of it any more (a live slice
    keeps its buffer's reference count up). A fresh block each time costs page faults to touch."""

    def __init__(self, raw: Any, where: str) -> None:
        decompressor = zstandard.ZstdDecompressor()
        self._reader = decompressor.stream_reader(raw, read_size=READ_SIZE, read_across_frames=True)
        self._where = where
        self._pool: list[bytearray] = []

    def __iter__(self) -> _Blocks:
        return self

    def __next__(self) -> memoryview:
        buffer = next((b for b in self._pool if sys.getrefcount(b) <= _FREE_REFS), None)
        if buffer is None:
            buffer = bytearray(BLOCK_BYTES)
            self._pool.append(buffer)
        try:
            size = self._reader.readinto(buffer)
        except zstandard.ZstdError as exc:
            raise ArchiveError(
                f"{self._where}: truncated or corrupt archive, or not a snapshot ({exc})"
            ) from exc
        if not size:
            raise StopIteration
        return memoryview(buffer)[:size]


def _free_refs() -> int:
    """sys.getrefcount of a pooled buffer that nothing else holds, counted as _Blocks counts it."""
    pool = [bytearray(1)]
    return next(sys.getrefcount(b) for b in pool)


_FREE_REFS = _free_refs()


def _read_manifest_member(reader: TarReader, where: str, limits: ReadLimits) -> CacheManifest:
    first = reader.next_member()
    if first is None or first.name != MANIFEST_MEMBER or not first.is_regular:
        raise ArchiveError(
            f"{where}: the first member is not {MANIFEST_MEMBER}: not a dflash-doctor snapshot"
        )
    if first.size > limits.max_manifest_bytes:
        raise ArchiveError(
            f"{where}: the manifest is {first.size} bytes, over the {limits.max_manifest_bytes} limit"
        )
    return CacheManifest.from_bytes(reader.read_data(first))


def open_archive(path: Path) -> BinaryIO:
    """The archive file, opened only when it is a regular file (a FIFO in the store would hang us)."""
    try:
        return open_regular(path, "snapshot archive")
    except ArchiveError:
        raise
    except DoctorError as exc:
        raise ArchiveError(exc.message) from None


def read_manifest(path: Path, limits: ReadLimits | None = None) -> CacheManifest:
    """The manifest, and the cheap checks of the whole file, so a truncated copy is never listed as
    restorable: a v2 archive must end with its seek table, whose frames must hold what the manifest
    declares; a v1 archive (one stream, no table) must be whole zstd frames to its last byte
    (frames.walk_frames: block headers only, no decompress), holding what the manifest declares
    when its frames say their size."""
    where = str(path)
    limits = limits or ReadLimits()
    with open_archive(path) as raw:
        frames = read_seek_table(raw, where)
        manifest = _read_manifest_member(TarReader(_Blocks(raw, where), where), where, limits)
        size = os.fstat(raw.fileno()).st_size
        if manifest.schema == MANIFEST_SCHEMA:
            if frames is None:
                raise ArchiveError(f"{where}: truncated archive: the seek table at its end is missing")
            held: int | None = sum(d for _, d in frames)
        else:
            held = walk_frames(raw, where) if frames is None else sum(d for _, d in frames)
    if held is not None and held < manifest.total_bytes:
        raise ArchiveError(f"{where}: truncated archive: its frames hold less than the manifest lists")
    limits.check_expansion(manifest.total_bytes, size, where)
    return manifest


def split_member_name(name: str, roots: set[str]) -> tuple[str, str]:
    """(root label, path inside it) of a member, or ArchiveError when the name is absolute, climbs
    with `..`, is not a clean relative path, or leaves every root. Plain string checks: the parts
    are neither empty, `.` nor `..`, so joining them under a folder stays inside it."""
    if "\x00" in name or not name:
        raise ArchiveError(f"member {name!r}: empty name or NUL byte")
    if name[0] == "/":
        raise ArchiveError(f"member {name!r}: absolute path (only paths inside the cache tree are accepted)")
    clean = name.rstrip("/")
    parts = clean.split("/")
    if ".." in parts:
        raise ArchiveError(f"member {name!r}: `..` in the path would climb out of the cache tree")
    if "" in parts or "." in parts:
        raise ArchiveError(f"member {name!r}: not a clean relative path")
    if len(parts) > MAX_DEPTH + 2:  # the root's label, MAX_DEPTH folders, a file (or one folder more)
        raise ArchiveError(
            f"member {printable(name, 120)!r}: more than {MAX_DEPTH} folders deep (no compiler nests so)"
        )
    label, _, inner = clean.partition("/")
    if label not in roots:
        raise ArchiveError(f"member {name!r}: outside the archive's roots ({', '.join(sorted(roots))})")
    return label, inner


def refuse_special(member: Member, roots: set[str]) -> None:
    """Only regular files and folders pass; links (escaping ones named as such), devices, fifos and
    anything else are refused."""
    name, kind = member.name, member.type
    if kind in (SYMLINK_TYPE, HARDLINK_TYPE):
        label = "symlink" if kind == SYMLINK_TYPE else "hardlink"
        target = member.linkname
        base = os.path.dirname(name.rstrip("/")) if kind == SYMLINK_TYPE else ""
        resolved = target if target.startswith("/") else os.path.normpath(os.path.join(base, target))
        if target.startswith("/") or resolved.startswith("..") or resolved.split("/")[0] not in roots:
            raise ArchiveError(f"member {name!r}: {label} to {target!r} points outside the cache tree")
        raise ArchiveError(
            f"member {name!r}: {label} to {target!r}: only regular files and folders are accepted"
        )
    if kind in (CHAR_TYPE, BLOCK_TYPE):
        raise ArchiveError(f"member {name!r}: device file (only regular files and folders are accepted)")
    if kind == FIFO_TYPE:
        raise ArchiveError(f"member {name!r}: fifo (only regular files and folders are accepted)")
    if not (member.is_regular or member.is_dir):
        raise ArchiveError(f"member {name!r}: unsupported member type {chr(kind)!r}")


def _umask() -> int | None:
    """This process's umask, read without changing it (os.umask would race other threads)."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _plan(
    reader: TarReader,
    manifest: CacheManifest,
    destinations: dict[str, str],
    limits: ReadLimits,
    where: str,
    hash_here: bool,
) -> Iterator[list[tuple[Any, ...]]]:
    """Check every member; yield batches of write operations for `_execute`.

    With `hash_here`, each member's sha256 is verified here, before its operation is yielded
    (a member in pieces: before its closing operation); otherwise each operation carries the
    expected sha256 for `_execute` to have verified. Raises ArchiveError at the first defect (the
    batch in progress is dropped with it)."""
    expected = manifest.by_path()
    roots = set(manifest.origins)
    umask = _umask()
    sha256 = hashlib.sha256
    made = set(destinations.values())
    # A member's folder (archive path) -> that folder on disk, made: filled by the first regular
    # member of each folder, which takes every check. A later member of a checked folder with a
    # plain file name (not empty, `.`, `..`, no NUL, no slash: rpartition) is a clean path too.
    folders: dict[str, str] = {}
    odd_names = ("", ".", "..")
    seen: set[str] = set()
    batch: list[tuple[Any, ...]] = []
    held = count = 0
    while (member := reader.next_member()) is not None:
        count += 1
        if count > limits.max_members:
            raise ArchiveError(f"{where}: more than {limits.max_members} members")
        name, kind, size, _ = member
        folder, _, base = name.rpartition("/")
        parent = folders.get(folder)
        if parent is not None and kind in REGULAR_TYPES and base not in odd_names and "\x00" not in base:
            target, key = f"{parent}/{base}", name
        else:  # every check, in order
            label, inner = split_member_name(name, roots)
            refuse_special(member, roots)
            target = f"{destinations[label]}/{inner}" if inner else destinations[label]
            if member.is_dir:
                if target not in made:
                    batch.append((_MKDIRS, target))
                    made.add(target)
                reader.skip_data(member)
                continue
            if not inner:
                raise ArchiveError(f"member {name!r}: a file where the cache folder itself belongs")
            if inner in _RESERVED:
                raise ArchiveError(f"member {name!r}: a name dflash-doctor keeps for its own records")
            key = f"{label}/{inner}"
            parent = target.rpartition("/")[0]
            if parent not in made:
                batch.append((_MKDIRS, parent))
                made.add(parent)
            folders[key.rpartition("/")[0]] = parent
        entry = expected.get(key)
        if entry is None:
            raise ArchiveError(
                f"member {key!r} is not in the manifest: the manifest does not match the members"
            )
        if key in seen:
            raise ArchiveError(f"member {key!r} appears twice")
        if size > limits.max_member_bytes:
            raise ArchiveError(
                f"member {key!r} is oversized: {size} bytes, over the {limits.max_member_bytes} limit"
            )
        if size != entry.size:
            raise ArchiveError(
                f"member {key!r} is {size} bytes but the manifest says {entry.size}: "
                "the manifest does not match the members"
            )
        seen.add(key)
        mode = entry.mode & 0o755  # never setuid, never group/world-writable
        chmod = umask is None or bool(mode & umask)  # the umask would take bits away: set them after
        check = None if hash_here else entry.sha256  # None: verified here
        view = reader.contiguous_data(member)
        if view is not None:
            if check is None and (digest := sha256(view).hexdigest()) != entry.sha256:
                raise _digest_error(key, digest, entry.sha256)
            batch.append((_FILE, target, mode, chmod, entry.mtime, view, key, check))
            held += size
        else:
            running = sha256()
            batch.append((_OPEN, target, mode, chmod, check))
            for piece in reader.data_views(member):
                if check is None:
                    running.update(piece)
                batch.append((_PIECE, piece))
                held += len(piece)
                if held >= BATCH_BYTES:
                    yield batch
                    batch, held = [], 0
            if check is None and (digest := running.hexdigest()) != entry.sha256:
                raise _digest_error(key, digest, entry.sha256)
            batch.append((_CLOSE, entry.mtime, key))
        if held >= BATCH_BYTES:
            yield batch
            batch, held = [], 0
    absent = sorted(set(expected) - seen)
    if absent:
        raise ArchiveError(
            f"the manifest lists {len(absent)} file(s) the archive does not hold (first: {absent[0]}): "
            "the manifest does not match the members"
        )
    if batch:
        yield batch


def _digest_error(key: str, digest: str, expected: str) -> ArchiveError:
    return ArchiveError(
        f"member {key!r}: sha256 {digest[:16]}… does not match the manifest's {expected[:16]}…"
    )


def _execute(
    batches: Iterator[list[tuple[Any, ...]]],
    on_file: Callable[[str], None] | None,
    verifier: _Verifier | None,
) -> None:
    """Carry out the write operations: each file created new (O_EXCL, no symlink followed), written,
    given its mode and mtime, closed. A member whose operation carries an expected sha256 goes to
    `verifier` once written (hashed in its thread while the next files are written)."""
    now = time.time()
    fd = -1
    open_, write, close, utime, fchmod = os.open, os.write, os.close, os.utime, os.fchmod
    jobs: list[tuple[Any, str, str]] = []
    # A member in pieces (larger than the block it starts in) is hashed here as it is written, never kept: held
    # for the hash thread, its pieces kept every block they lay in alive, so a restore's memory grew with its
    # largest member (issue 58, H1: a 900 MB member, 944 MB resident).
    running: Any = None  # the sha256 of the member being written in pieces, when it is to be verified
    expected = ""
    target = ""
    try:
        for batch in batches:
            if jobs:
                assert verifier is not None
                verifier.submit(jobs)
                jobs = []
            for op in batch:
                kind = op[0]
                if kind == _FILE:
                    _, target, mode, chmod, mtime, view, key, check = op
                    fd = open_(target, _WRITE_FLAGS, mode)
                    if check is not None:
                        jobs.append((view, check, key))
                    while view:
                        view = view[write(fd, view) :]
                    if chmod:
                        fchmod(fd, mode)
                    utime(fd, (now, mtime))
                    close(fd)
                    fd = -1
                    if on_file is not None:
                        on_file(key)
                elif kind == _PIECE:
                    view = op[1]
                    if running is not None:
                        running.update(view)
                    while view:
                        view = view[write(fd, view) :]
                elif kind == _MKDIRS:
                    target = op[1]
                    _make_folders(target)
                elif kind == _OPEN:
                    _, target, mode, chmod, check = op
                    fd = open_(target, _WRITE_FLAGS, mode)
                    running, expected = (hashlib.sha256(), check) if check is not None else (None, "")
                    if chmod:
                        fchmod(fd, mode)
                else:  # _CLOSE
                    _, mtime, key = op
                    utime(fd, (now, mtime))
                    close(fd)
                    fd = -1
                    if running is not None:
                        if (digest := running.hexdigest()) != expected:
                            raise _digest_error(key, digest, expected)
                        running = None
                    if on_file is not None:
                        on_file(key)
        if jobs:
            assert verifier is not None
            verifier.submit(jobs)
    except OSError as exc:
        raise _write_error(exc, target) from None
    finally:
        if fd >= 0:
            close(fd)


def _make_folders(path: str) -> None:
    """`os.makedirs(path, 0o755, exist_ok=True)`, but every folder made 0o755 at most: makedirs makes
    the intermediate ones 0o777 less the umask, world-writable under `umask 000`."""
    try:
        os.mkdir(path, 0o755)
    except FileNotFoundError:
        _make_folders(os.path.dirname(path))
        os.mkdir(path, 0o755)
    except FileExistsError:
        if os.path.islink(path) or not os.path.isdir(path):
            raise


def _write_error(exc: OSError, target: str) -> DoctorError:
    """A failed write as a message: the disk, or a member that cannot exist beside another."""
    where = printable(str(exc.filename or target))
    if exc.errno == errno.ENOSPC:
        return DoctorError(
            f"no space left on the device while writing {where}", hint="free some space, then restore again"
        )
    if exc.errno in (errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
        return ArchiveError(f"{where}: the archive holds a file and a folder of the same name")
    if exc.errno == errno.ENAMETOOLONG:
        return ArchiveError(f"{where}: a name longer than this filesystem allows")
    return DoctorError(f"could not write {where}: {exc.strerror}")


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()


class _Ahead:
    """Run an iterator in a thread, a few items ahead; `with` stops and joins the thread."""

    def __init__(self, name: str, depth: int) -> None:
        self._source: Iterator[Any] = iter(())
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in self._source:
                if not self._put(item):
                    return
            self._put(_DONE)
        except BaseException as exc:
            self._put(_Failed(exc))
        finally:
            close = getattr(self._source, "close", None)
            if close is not None:
                close()

    def run(self, source: Iterator[Any]) -> _Ahead:
        self._source = source
        return self

    def __enter__(self) -> Iterator[Any]:
        self._thread.start()
        return self._items()

    def _items(self) -> Iterator[Any]:
        while True:
            item = self._queue.get()
            if item is _DONE:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self._queue.get(timeout=0.05)
        self._thread.join()


def _mismatch(jobs: list[tuple[Any, str, str]]) -> ArchiveError | None:
    """Hash each (view, expected sha256, key): a member that lay in one block; the first mismatch, or None."""
    sha256 = hashlib.sha256
    for view, expected, key in jobs:
        digest = sha256(view).hexdigest()
        if digest != expected:
            return _digest_error(key, digest, expected)
    return None


class _Verifier:
    """A thread that hashes written members (batches of (views, expected sha256, key)) and keeps the
    first mismatch; `finish()` waits for it and raises that mismatch. When it is behind (its queue
    full), `submit` hashes the batch in the calling thread instead of waiting."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=BATCHES_TO_HASH)
        self.failure: ArchiveError | None = None
        self._thread = threading.Thread(target=self._run, name="dflash-restore-hash", daemon=True)

    def _run(self) -> None:
        while (jobs := self._queue.get()) is not None:
            if self.failure is None:
                self.failure = _mismatch(jobs)

    def submit(self, jobs: list[tuple[Any, str, str]]) -> None:
        if self.failure is not None:
            raise self.failure
        try:
            self._queue.put_nowait(jobs)
        except queue.Full:
            failure = _mismatch(jobs)
            if failure is not None:
                raise failure from None

    def finish(self) -> None:
        self._queue.put(None)
        self._thread.join()
        if self.failure is not None:
            raise self.failure

    def __enter__(self) -> _Verifier:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop the thread (a no-op after `finish`)."""
        self.failure = self.failure or ArchiveError("abandoned")
        while self._thread.is_alive():
            with contextlib.suppress(queue.Full):
                self._queue.put(None, timeout=0.05)
        self._thread.join()


def extract_verified(
    path: Path,
    destinations: dict[str, Path] | Callable[[CacheManifest], dict[str, Path]],
    limits: ReadLimits | None = None,
    accept: Callable[[CacheManifest], None] | None = None,
    on_file: Callable[[str], None] | None = None,
    threaded: bool = True,
) -> CacheManifest:
    """Stream the archive into `destinations` (root label -> an empty folder we own), verifying all.

    `accept(manifest)` runs after the manifest is read and before any file is written: it may refuse
    (fingerprint mismatch, not enough room) by raising. `destinations` may be a function of the
    manifest, called after `accept` (it may refuse too, or make the folders). Raises ArchiveError on
    the first defect; the caller owns the destinations and removes them on failure.
    `threaded=False` does the same work in the calling thread alone.
    """
    limits = limits or ReadLimits()
    where = str(path)
    with contextlib.ExitStack() as stack:
        raw = stack.enter_context(open_archive(path))
        frames = read_seek_table(raw, where)
        blocks: Iterator[bytes | memoryview] = (
            _Blocks(raw, where) if frames is None else FrameBlocks(raw, frames, where)
        )
        if threaded:  # decompressing starts now, beside the manifest's parsing
            blocks = stack.enter_context(_Ahead("dflash-restore-unzstd", BLOCKS_AHEAD).run(blocks))
        reader = TarReader(blocks, where)
        manifest = _read_manifest_member(reader, where, limits)
        limits.check_expansion(manifest.total_bytes, os.fstat(raw.fileno()).st_size, where)
        if accept is not None:
            accept(manifest)
        if callable(destinations):
            destinations = destinations(manifest)
        roots = set(manifest.origins)
        missing_roots = roots - set(destinations)
        if missing_roots:
            raise ArchiveError(
                f"{path}: no destination for archive root(s) {', '.join(sorted(missing_roots))}"
            )
        if manifest.total_bytes > limits.max_total_bytes:
            raise ArchiveError(
                f"{path}: {manifest.total_bytes} bytes in all, over the {limits.max_total_bytes} limit"
            )
        folders = {label: os.fspath(folder).rstrip("/") or "/" for label, folder in destinations.items()}
        plan = _plan(reader, manifest, folders, limits, where, hash_here=not threaded)
        stack.callback(plan.close)  # type: ignore[attr-defined]  # a generator: it has close()
        verifier = stack.enter_context(_Verifier()) if threaded else None
        _execute(plan, on_file, verifier)
        if verifier is not None:
            verifier.finish()
    return manifest
