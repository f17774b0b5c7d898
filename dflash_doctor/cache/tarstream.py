"""A lean reader for the tar stream inside a snapshot: headers parsed from big decompressed blocks.

Python's `tarfile` builds a TarInfo per member through a dozen small calls and slices its buffer on
every read; for a cache of 9000 small files that costs more than decompressing and hashing all of it.
This reader takes the decompressed stream in blocks (1 MiB here), parses each 512-byte header in place
and hands out member data as memoryview slices of those blocks (no copy). It understands what Python's
tarfile and GNU tar write: ustar/v7 headers (octal or base-256 numbers, the ustar name prefix), pax
extended headers (`path`, `linkpath`, `size`) and GNU long names/link names. A global pax header is
refused here; sparse files and other types are returned for the caller to refuse. It checks what tar itself checks (header checksums, the end-of-archive marker) and reports a
stream that stops early as truncated; what members may be is the caller's business.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import NamedTuple

from dflash_doctor.cache.manifest import ArchiveError

BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)
# Extension records (pax headers, GNU long names) are read whole into memory: bound them, one by one
# and together per member (1,000 pax headers of 1 MiB before one member once took 3.6 GB), and keep
# only the pax keys we use (a record's other keys are parsed, checked and dropped).
MAX_EXTENSION_BYTES = 1 << 20
MAX_EXTENSIONS_PER_MEMBER = 4
PAX_KEYS = frozenset({"path", "linkpath", "size"})

REGULAR_TYPES = frozenset(b"07\0")  # regular, contiguous (a regular file to every tar), old-style regular
DIR_TYPE = ord("5")
HARDLINK_TYPE, SYMLINK_TYPE = ord("1"), ord("2")
CHAR_TYPE, BLOCK_TYPE, FIFO_TYPE = ord("3"), ord("4"), ord("6")
PAX_TYPE, PAX_GLOBAL_TYPE = ord("x"), ord("g")
GNU_LONGNAME, GNU_LONGLINK = ord("L"), ord("K")


class Member(NamedTuple):
    """One member's header, extensions applied. `type` is the typeflag byte as an int; `linkname`
    is only read for links (empty for every other type)."""

    name: str
    type: int
    size: int
    linkname: str

    @property
    def is_regular(self) -> bool:
        return self.type in REGULAR_TYPES

    @property
    def is_dir(self) -> bool:
        return self.type == DIR_TYPE


def _number(field: bytes, what: str, where: str) -> int:
    """An octal header number (tar's usual form) or GNU base-256 (first byte 0x80 or 0xff)."""
    if field[:1] in (b"\x80", b"\xff"):
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * (len(field) - 1))) if field[0] == 0xFF else value
    try:
        return int(field.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        raise ArchiveError(f"{where}: corrupt tar header (bad {what} field {field!r})") from None


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


_ADLER_MOD = 65521


def _check_sum(header: bytes, where: str) -> None:
    """tar's checksum: the sum of the header's bytes, its own field counted as 8 spaces (unsigned
    bytes; some old tars summed signed bytes, accepted too, as tarfile does)."""
    stored = _number(header[148:156], "checksum", where)
    # sum(header) costs 3 µs a header in Python; adler32's low half is (1 + sum) mod 65521 and
    # int.from_bytes(...) % 255 is sum mod 255 (256 = 1 mod 255): together they fix any sum
    # below 65521 * 255, and a header sums to at most 512 * 255. 1 µs, the same answer.
    low = (zlib.adler32(header) & 0xFFFF) - 1
    raw = low if low >= 0 else _ADLER_MOD - 1
    if raw % 255 != int.from_bytes(header, "little") % 255:
        raw += _ADLER_MOD
    unsigned = raw - sum(header[148:156]) + 256
    if stored != unsigned:
        signed = unsigned - 256 * sum(1 for byte in header[:148] + header[156:] if byte > 127)
        if stored != signed:
            raise ArchiveError(f"{where}: corrupt tar header (bad checksum): truncated or corrupt archive")


def parse_pax(data: bytes, where: str) -> dict[str, str]:
    """Records `<length> <key>=<value>\\n`; a malformed one is a corrupt archive."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise ArchiveError(f"{where}: corrupt pax header") from None
        record = data[space + 1 : pos + length]
        if space < 0 or length <= 0 or pos + length > len(data) or not record.endswith(b"\n"):
            raise ArchiveError(f"{where}: corrupt pax header")
        key, equals, value = record[:-1].partition(b"=")
        if not equals:
            raise ArchiveError(f"{where}: corrupt pax header")
        name = key.decode("utf-8", "surrogateescape")
        if name in PAX_KEYS:
            records[name] = value.decode("utf-8", "surrogateescape")
        elif name.startswith("GNU.sparse"):
            records[name] = ""  # only its presence matters: a sparse member is refused
        pos += length
    return records


class TarReader:
    """Members of a tar stream given as an iterator of byte blocks (any sizes).

    Call `next_member()`, then exactly one of `data_views(member)` (the member's bytes as memoryviews
    into the blocks, in order) or `read_data(member)` (one bytes object), before the next member.
    """

    def __init__(self, blocks: Iterator[bytes | memoryview], where: str) -> None:
        self.blocks = blocks
        self._where = where
        self._buf: bytes | memoryview = b""
        self._view = memoryview(self._buf)
        self._pos = 0
        self.ended = False

    # -- the block buffer

    def _advance(self) -> bool:
        """Load the next non-empty block; False at the end of the stream."""
        for block in self.blocks:
            if block:
                self._buf, self._view, self._pos = block, memoryview(block), 0
                return True
        return False

    def _truncated(self, what: str) -> ArchiveError:
        return ArchiveError(f"{self._where}: truncated archive: the stream ends inside {what}")

    def _take(self, count: int, what: str) -> bytes:
        """`count` contiguous bytes (copied; only for headers and small records)."""
        pos, buf = self._pos, self._buf
        if pos + count <= len(buf):
            self._pos = pos + count
            return bytes(buf[pos : pos + count])
        parts = [buf[pos:]]
        have = len(parts[0])
        while have < count:
            if not self._advance():
                raise self._truncated(what)
            piece = self._buf[: count - have]
            parts.append(piece)
            have += len(piece)
            self._pos = len(piece)
        return b"".join(parts)

    def _skip(self, count: int, what: str) -> None:
        while count:
            left = len(self._buf) - self._pos
            if left == 0:
                if not self._advance():
                    raise self._truncated(what)
                continue
            step = min(left, count)
            self._pos += step
            count -= step

    # -- members

    def next_member(self) -> Member | None:
        """The next file, folder, link or special member; None after the end-of-archive marker."""
        if self.ended:
            return None
        long_name = long_link = None
        pax: dict[str, str] = {}
        where = self._where
        extensions = extension_bytes = 0
        while True:
            pos, buf = self._pos, self._buf
            if pos + BLOCK <= len(buf):  # the usual case: the header lies in the current block
                header = bytes(buf[pos : pos + BLOCK])
                self._pos = pos + BLOCK
            else:
                if pos == len(buf) and not self._advance():
                    raise ArchiveError(
                        f"{where}: truncated archive: the stream ends before tar's end-of-archive marker"
                    )
                header = self._take(BLOCK, "a tar header")
            if header == ZERO_BLOCK:
                self.ended = True
                return None
            _check_sum(header, where)
            kind = header[156]
            size_field = header[124:136]
            if size_field[0] < 0x80:
                try:
                    size = int(size_field.split(b"\0", 1)[0].strip() or b"0", 8)
                except ValueError:
                    raise ArchiveError(
                        f"{where}: corrupt tar header (bad size field {size_field!r})"
                    ) from None
            else:
                size = _number(size_field, "size", where)
            if kind == PAX_GLOBAL_TYPE:  # it would change every later member: never written by us
                raise ArchiveError(f"{where}: unsupported member type 'g' (a pax global header)")
            if kind in (PAX_TYPE, GNU_LONGNAME, GNU_LONGLINK):
                extensions += 1
                extension_bytes += size
                if not 0 <= size <= MAX_EXTENSION_BYTES or extension_bytes > MAX_EXTENSION_BYTES:
                    raise ArchiveError(
                        f"{where}: tar extension headers of {extension_bytes} bytes before one member, "
                        f"over the {MAX_EXTENSION_BYTES} limit"
                    )
                if extensions > MAX_EXTENSIONS_PER_MEMBER:
                    raise ArchiveError(
                        f"{where}: more than {MAX_EXTENSIONS_PER_MEMBER} tar extension headers before one member"
                    )
                data = self._take(size, "an extension header")
                self._skip(-size % BLOCK, "an extension header")
                if kind == PAX_TYPE:
                    pax.update(parse_pax(data, where))
                elif kind == GNU_LONGNAME:
                    long_name = _text(data)
                else:
                    long_link = _text(data)
                continue
            if long_name is not None:
                name = long_name
            else:
                name = header[0:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                if header[345] and header[257:263] == b"ustar\0":  # POSIX ustar's prefix: names up to 256
                    name = f"{_text(header[345:500])}/{name}"
            linkname = ""
            if kind in (HARDLINK_TYPE, SYMLINK_TYPE):
                linkname = long_link if long_link is not None else _text(header[157:257])
            if pax:
                name = pax.get("path", name)
                if kind in (HARDLINK_TYPE, SYMLINK_TYPE):
                    linkname = pax.get("linkpath", linkname)
                if "size" in pax:
                    try:
                        size = int(pax["size"]) if len(pax["size"]) <= 20 else -1
                    except ValueError:
                        raise ArchiveError(f"{where}: corrupt pax header (size {pax['size']!r})") from None
                if any(key.startswith("GNU.sparse") for key in pax):
                    kind = ord("S")  # a sparse file: unsupported, the caller refuses it
            if size < 0:
                raise ArchiveError(f"{where}: corrupt tar header (negative size)")
            if kind == 0 and name.endswith("/"):
                kind = DIR_TYPE  # v7 tar writes a folder as a regular member named with a slash
            if kind == DIR_TYPE:
                name = name.rstrip("/")
            return Member(name, kind, size, linkname)

    def contiguous_data(self, member: Member) -> memoryview | None:
        """The member's bytes as one slice when they lie in the current block (padding skipped);
        None, consuming nothing, when they do not: then use `data_views`."""
        pos, size = self._pos, member.size
        end = pos + size
        if end > len(self._buf):
            return None
        padded = end + (-size % BLOCK)
        if padded <= len(self._buf):
            self._pos = padded
        else:
            self._pos = end
            self._skip(padded - end, f"member {member.name!r}")
        return self._view[pos:end]

    def data_views(self, member: Member) -> Iterator[memoryview]:
        """The member's bytes as slices of the decompressed blocks, then skips its padding."""
        left = member.size
        what = f"member {member.name!r}"
        while left:
            pos = self._pos
            avail = len(self._buf) - pos
            if avail == 0:
                if not self._advance():
                    raise self._truncated(what)
                continue
            step = avail if avail < left else left
            self._pos = pos + step
            left -= step
            yield self._view[pos : pos + step]
        self._skip(-member.size % BLOCK, what)

    def read_data(self, member: Member) -> bytes:
        data = self._take(member.size, f"member {member.name!r}")
        self._skip(-member.size % BLOCK, f"member {member.name!r}")
        return data

    def skip_data(self, member: Member) -> None:
        self._skip(member.size + (-member.size % BLOCK), f"member {member.name!r}")
