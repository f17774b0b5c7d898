"""Snapshot archives as independent zstd frames plus a seek table (zstd's seekable format).

Why frames: python-zstandard's streaming decompressor holds the GIL while it decompresses; its
one-shot `decompress()` releases it. Cut into frames of FRAME_BYTES (tar stream bytes, cut anywhere),
an archive is decompressed frame by frame in a thread that really runs beside the one writing files,
and compressed frame by frame on a thread pool (faster than zstd's own multi-threaded stream, same
size within 0.1%). A stream of frames followed by a skippable frame is still one ordinary `.zst`:
`zstd -d` and `tar --zstd` read it as before, skipping the table.

The seek table is zstd's seekable format
(github.com/facebook/zstd, contrib/seekable_format/zstd_seekable_compression_format.md): a skippable
frame (magic 0x184D2A5E) at the end of the file with, per frame, its compressed and decompressed
sizes, then the frame count, a descriptor byte and the magic 0x8F92EAB1. It is read as untrusted: the
frames must tile the file exactly up to the table, each must be one whole zstd frame of exactly the
listed compressed size that declares exactly the listed decompressed size (at most MAX_FRAME_BYTES);
anything else is refused as a corrupt archive. An archive without a table (written before frames, or
by anyone else) is read as one stream instead; `walk_frames` checks such a stream is whole without
decompressing it (a listing must not cost a restore).
"""

from __future__ import annotations

import os
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import BinaryIO

import zstandard

from dflash_doctor.cache.manifest import ArchiveError

FRAME_BYTES = 2 << 20  # tar bytes per frame: 1-8 MiB measured within 0.1% in size, 2 MiB the fastest
MAX_FRAME_BYTES = 64 << 20  # a listed frame that decompresses to more is refused (memory)
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
MAX_FRAME_HEADER_BYTES = 18  # magic, descriptor, window, dictionary id, content size
SKIPPABLE_MAGIC = 0x184D2A5E
SEEKABLE_MAGIC = 0x8F92EAB1
_FOOTER = struct.Struct("<IBI")  # frame count, descriptor, seekable magic
_ENTRY = struct.Struct("<II")  # compressed size, decompressed size
_SKIPPABLE_HEADER = struct.Struct("<II")  # magic, size of what follows


def seek_table(entries: list[tuple[int, int]]) -> bytes:
    """The skippable frame that ends a framed archive (no per-frame checksums: sha256 covers files)."""
    body = b"".join(_ENTRY.pack(c, d) for c, d in entries) + _FOOTER.pack(len(entries), 0, SEEKABLE_MAGIC)
    return _SKIPPABLE_HEADER.pack(SKIPPABLE_MAGIC, len(body)) + body


class FramedWriter:
    """A write-only file object: what is written is cut into FRAME_BYTES pieces, each compressed as
    its own frame on `threads` threads (one-shot compress releases the GIL), and written in order
    to `out`; `close()` compresses the rest and writes the seek table. `out` is left open."""

    def __init__(self, out: BinaryIO, level: int = 3, threads: int = -1) -> None:
        self._out = out
        self._level = level
        # -1: the cores, up to 8 (each holds a compressor and 2 frames in flight; 8 already outrun a disk)
        self._threads = threads if threads > 0 else min(8, os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="dflash-snapshot-zstd")
        self._local = threading.local()
        self._pending: list[memoryview] = []
        self._pending_size = 0
        self.written = 0  # bytes written so far (uncompressed)
        self._in_flight: deque[tuple[Future[bytes], int]] = deque()
        self.entries: list[tuple[int, int]] = []
        self.closed = False

    def _compress(self, chunk: bytes) -> bytes:
        compressor = getattr(self._local, "compressor", None)
        if compressor is None:  # one per thread: a compressor is not to be shared
            compressor = self._local.compressor = zstandard.ZstdCompressor(level=self._level)
        return compressor.compress(chunk)

    def _write_oldest(self) -> None:
        future, size = self._in_flight.popleft()
        frame = future.result()
        self._out.write(frame)
        self.entries.append((len(frame), size))

    def _submit(self, chunk: bytes) -> None:
        self._in_flight.append((self._pool.submit(self._compress, chunk), len(chunk)))
        while len(self._in_flight) > 2 * self._threads:
            self._write_oldest()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Keep `data` (not copied: it must not change afterwards; bytes never do) until a frame's
        worth is there, then join exactly FRAME_BYTES of it into one frame's input."""
        size = len(data)
        view = memoryview(data)
        while len(view) >= FRAME_BYTES - self._pending_size:
            room = FRAME_BYTES - self._pending_size
            self._pending.append(view[:room])
            self._submit(b"".join(self._pending))
            self._pending, self._pending_size = [], 0
            view = view[room:]
        if view:
            self._pending.append(view)
            self._pending_size += len(view)
        self.written += size
        return size

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if self._pending:
                self._submit(b"".join(self._pending))
                self._pending, self._pending_size = [], 0
            while self._in_flight:
                self._write_oldest()
            self._out.write(seek_table(self.entries))
        finally:
            self.abandon()

    def __enter__(self) -> FramedWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        """Stops the threads; the seek table is only written by `close()` (not after an error)."""
        self.abandon()

    def abandon(self) -> None:
        """Stop the compressing threads (what is queued is dropped)."""
        self.closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)


def _corrupt(where: str, why: str) -> ArchiveError:
    return ArchiveError(f"{where}: corrupt archive: {why}")


def read_seek_table(raw: BinaryIO, where: str) -> list[tuple[int, int]] | None:
    """The frames (compressed, decompressed size) listed at the end of `raw`; None when the file does
    not end with a seek table. Leaves `raw` at offset 0."""
    size = os.fstat(raw.fileno()).st_size
    try:
        if size < _SKIPPABLE_HEADER.size + _FOOTER.size:
            return None
        raw.seek(size - _FOOTER.size)
        count, descriptor, magic = _FOOTER.unpack(raw.read(_FOOTER.size))
        if magic != SEEKABLE_MAGIC:
            return None
        if descriptor & 0x7C:
            raise _corrupt(where, "the seek table's reserved bits are set")
        entry_size = 12 if descriptor & 0x80 else 8  # with per-frame checksums (not checked: sha256 is)
        body = count * entry_size + _FOOTER.size
        table_start = size - _SKIPPABLE_HEADER.size - body
        if table_start < 0:
            raise _corrupt(where, f"the seek table lists {count} frames, more than the file holds")
        raw.seek(table_start)
        skippable, length = _SKIPPABLE_HEADER.unpack(raw.read(_SKIPPABLE_HEADER.size))
        if skippable != SKIPPABLE_MAGIC or length != body:
            raise _corrupt(where, "the seek table's frame header does not match its footer")
        listed = raw.read(count * entry_size)
        entries = [_ENTRY.unpack_from(listed, i * entry_size) for i in range(count)]
        if sum(c for c, _ in entries) != table_start:
            raise _corrupt(where, "the frames in the seek table do not cover the file up to the table")
        for compressed, decompressed in entries:
            if decompressed > MAX_FRAME_BYTES or compressed > 2 * MAX_FRAME_BYTES:
                raise _corrupt(where, f"a frame of {decompressed} bytes, over the {MAX_FRAME_BYTES} limit")
        return entries
    finally:
        raw.seek(0)


class FrameEndsEarly(ValueError):
    """The bytes stop inside a zstd frame: a copy cut short."""


def _frame_end(read: Callable[[int, int], bytes | bytearray | memoryview], start: int) -> int:
    """Where the zstd frame at `start` ends (header, blocks, checksum), found by walking its block
    headers without decompressing; `read(offset, count)` returns up to `count` bytes there.
    FrameEndsEarly when the bytes stop inside a header; ZstdError/ValueError if malformed. The end
    returned may lie past the bytes there are (the last block cut short): the caller compares."""
    header = read(start, MAX_FRAME_HEADER_BYTES)
    try:
        params = zstandard.get_frame_parameters(header)
        pos = start + zstandard.frame_header_size(header)
    except zstandard.ZstdError:
        if len(header) < MAX_FRAME_HEADER_BYTES:
            raise FrameEndsEarly("the bytes end inside the frame header") from None
        raise
    while True:
        block = read(pos, 3)
        if len(block) < 3:
            raise FrameEndsEarly("the bytes end inside a block header")
        value = int.from_bytes(block, "little")
        pos += 3
        kind = (value >> 1) & 3
        if kind == 3:
            raise ValueError("a reserved block type")
        pos += 1 if kind == 1 else value >> 3  # an RLE block stores one byte
        if value & 1:  # the last block
            break
    return pos + (4 if params.has_checksum else 0)


def frame_length(frame: bytes | bytearray | memoryview) -> int:
    """How many bytes the zstd frame at the start of `frame` takes, found without decompressing;
    ZstdError/ValueError if malformed."""
    return _frame_end(lambda offset, count: frame[offset : offset + count], 0)


def walk_frames(raw: BinaryIO, where: str) -> int | None:
    """Check, without decompressing, that the file is whole zstd frames end to end (skippable frames
    allowed): how a stream without a seek table (a v1 archive) shows it was cut short. Reads 3 bytes a
    block (a block holds up to 128 KiB), so a 1 GB archive costs thousands of small reads, not a
    decompress. Returns the decompressed size the frames declare (None when one does not say).
    ArchiveError: truncated, or bytes that are not a frame."""
    fd = raw.fileno()
    size = os.fstat(fd).st_size

    def read(offset: int, count: int) -> bytes:
        return os.pread(fd, count, offset)

    pos, frames = 0, 0
    declared: int | None = 0
    while pos < size:
        magic = read(pos, 4)
        if magic == ZSTD_MAGIC:
            try:
                end = _frame_end(read, pos)
            except FrameEndsEarly:
                end = size + 1
            except (zstandard.ZstdError, ValueError) as exc:
                raise _corrupt(where, f"a malformed zstd frame at byte {pos} ({exc})") from None
            content = zstandard.frame_content_size(read(pos, MAX_FRAME_HEADER_BYTES))
            if declared is not None:
                declared = None if content < 0 else declared + content
            frames += 1
        elif len(magic) == 4 and int.from_bytes(magic, "little") & ~0xF == SKIPPABLE_MAGIC & ~0xF:
            length = read(pos + 4, 4)
            end = pos + 8 + int.from_bytes(length, "little") if len(length) == 4 else size + 1
        elif len(magic) < 4:
            end = size + 1
        else:
            raise _corrupt(where, f"the bytes at {pos} are not a zstd frame")
        if end > size:
            raise ArchiveError(
                f"{where}: truncated archive: the file ends inside the zstd frame at byte {pos} "
                f"({size} bytes: a copy cut short)"
            )
        pos = end
    if not frames:
        raise _corrupt(where, "no zstd frame in it")
    return declared


class FrameBlocks:
    """The decompressed tar stream of a framed archive, one frame per block, decompressed one-shot
    (the GIL released); each frame checked against the seek table first."""

    def __init__(self, raw: BinaryIO, entries: list[tuple[int, int]], where: str) -> None:
        self._raw = raw
        self._entries = iter(entries)
        self._where = where
        self._input = bytearray(max((c for c, _ in entries), default=0))
        self._decompressor = zstandard.ZstdDecompressor()

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        compressed, decompressed = next(self._entries)
        view = memoryview(self._input)[:compressed]
        got = self._raw.readinto(view)  # type: ignore[attr-defined]  # an unbuffered file has it
        if got != compressed:
            raise ArchiveError(f"{self._where}: truncated archive: a frame ends early")
        where = self._where
        if view[:4] != ZSTD_MAGIC:
            raise _corrupt(where, "a frame listed in the seek table is not a zstd frame")
        try:
            length = frame_length(view)
            declared = zstandard.frame_content_size(view)
        except (zstandard.ZstdError, ValueError) as exc:
            raise _corrupt(where, f"a malformed frame ({exc})") from None
        if length != compressed:
            raise _corrupt(where, f"a frame takes {length} bytes, the seek table says {compressed}")
        if declared != decompressed:
            raise _corrupt(where, f"a frame holds {declared} bytes, the seek table says {decompressed}")
        try:
            data = self._decompressor.decompress(view)
        except zstandard.ZstdError as exc:
            raise _corrupt(where, str(exc)) from None
        if len(data) != decompressed:
            raise _corrupt(where, f"a frame gave {len(data)} bytes, the seek table says {decompressed}")
        return data
