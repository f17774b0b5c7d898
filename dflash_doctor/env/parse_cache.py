"""Parsed RECORDs, dist-info headers and ELF dynamic sections, kept across runs (as mypy and ruff keep theirs).

A warm `check` should not parse 20k RECORD rows and a hundred ELF files that have not changed since the
last run. Each entry is stored with the stat signature of the file(s) it was parsed from (size, mtime_ns,
inode, ctime_ns, device) and is used only while the file still has exactly that signature: pip writes
RECORD and every library as a new file renamed into place (new inode), any in-place write moves mtime
and ctime, and ctime cannot be set back. A changed RECORD, a replaced `.so` or an edited METADATA is
parsed again on the next run; the file is always stat'ed, never trusted on its name.

A file that changed within the last `RACY_SECONDS` is parsed but not stored: a second write in the same
filesystem timestamp tick, with the same size, could otherwise hide behind an unchanged signature (git's
"racily clean" problem).

One cache file per audited environment (its site folders), `<cache root>/parse-cache/<hash>.bin` (the
cache root: `$DFLASH_DOCTOR_HOME/cache` or the platform's user cache folder). Layout: a header line
naming the schema, the Python version and the marshal version; a CRC-32 of the body; the body, plain
tuples, lists, strings and ints in `marshal` format (20k rows load in a few ms; JSON takes tens). It is
written beside and renamed over the old file, only when something changed, without fsync: a torn file
fails its checksum and is rebuilt. A file with another header, a bad checksum, a body that does not load
or has the wrong shape, or one owned by another user, is ignored and rebuilt. A cache folder that cannot
be written just means no caching.
"""

from __future__ import annotations

import gc
import hashlib
import marshal
import os
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from dflash_doctor.env.forked import Started, process_count, start_slices
from dflash_doctor.paths import cache_root

T = TypeVar("T")

# v2: RECORD rows of `--target` folders resolved against the folder; v3: without pip's compiled bytecode rows;
# v4: what is derived from the whole environment ("derived": the requirement graph, the paths several rows claim)
SCHEMA = "dflash-doctor/parse-cache/v4"
HEADER = f"{SCHEMA} py{sys.version_info[0]}.{sys.version_info[1]} marshal{marshal.version}\n".encode()
TABLES = ("dists", "records", "elf", "derived")
MAX_ENTRIES = {"dists": 4096, "records": 4096, "elf": 20_000, "derived": 16}
RACY_SECONDS = 2.0
_CRC = struct.Struct("<I")

Stamp = tuple[int, int, int, int, int]  # size, mtime_ns, inode, ctime_ns, device


def stamp_of(path: str) -> Stamp | None:
    """The stat signature an entry is valid for; None when the file cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, st.st_dev)


def cache_file_for(site_dirs: Iterable[str]) -> Path:
    """`<cache root>/parse-cache/<hash of the site folders>.bin`: one file per audited environment."""
    scope = "\n".join(os.path.realpath(d) for d in site_dirs)
    return cache_root() / "parse-cache" / f"{hashlib.sha256(scope.encode()).hexdigest()[:24]}.bin"


class ParseCache:
    """Parse results by file, each valid only while its file's stat signature is unchanged.

    `get(table, key, stamp, parse)` returns the stored value when `stamp` equals the stored one, else
    calls `parse()`, stores its result (when the file is not racily new) and returns it. Values must be
    made of tuples, lists, strings, ints, floats, bools and None.
    """

    def __init__(self, path: Path | None = None, tables: dict[str, dict[str, tuple[Any, Any]]] | None = None):
        self.path = path
        self.tables: dict[str, dict[str, tuple[Any, Any]]] = {t: {} for t in TABLES}
        if tables:
            self.tables.update(tables)
        self.used: dict[str, set[str]] = {t: set() for t in TABLES}
        self.hits = 0
        self.misses = 0
        self.loaded_from_disk = bool(tables)
        self._dirty = False

    @classmethod
    def load(cls, path: Path) -> ParseCache:
        """Read a cache file; anything foreign, corrupt or not ours gives an empty cache (rebuilt on save)."""
        return cls(path, _read_tables(path))

    @classmethod
    def for_site_dirs(cls, site_dirs: Iterable[str]) -> ParseCache:
        return cls.load(cache_file_for(site_dirs))

    def get(self, table: str, key: str, stamp: Any, parse: Callable[[], T]) -> T:
        rows = self.tables[table]
        entry = rows.get(key)
        if entry is not None and stamp is not None and entry[0] == stamp:
            self.used[table].add(key)
            self.hits += 1
            value: T = entry[1]
            return value
        self.misses += 1
        value = parse()
        self._keep(table, key, stamp, value)
        return value

    def _keep(self, table: str, key: str, stamp: Any, value: Any) -> None:
        """Store a fresh parse, unless its file is gone or racily new."""
        if stamp is None or _racy(stamp):
            return
        rows = self.tables[table]
        rows.pop(key, None)  # re-insert at the end: the newest rows survive the size bound
        rows[key] = (stamp, value)
        self.used[table].add(key)
        self._dirty = True

    def start_prefill(
        self,
        table: str,
        keys: Sequence[str],
        parse: Callable[[str], Any],
        per_process: int,
        limit: int = 4,
        stamp: Callable[[str], Any] = stamp_of,
    ) -> StartedPrefill | None:
        """Parse the keys this cache has no entry for at all (a first run, packages installed since) in forked
        children started now (`forked.start_slices`), each stamping and parsing its slice, beside this process's
        other work; `absorb()` stores what they parsed as `get` stores it, so the `get` that follows is a hit.
        Worth it on a first `check` of a GPU host: ~200 METADATA and RECORDs and ~1,000 ELF headers read from a
        cold disk one after another otherwise. Keys with a stale entry are left to `get` (a few upgraded
        packages). `stamp`: the key's stamp, as its `get` computes it (a file's own by default). None when there
        is nothing to do, too little to fork for, or forking is not safe."""
        todo = [key for key in keys if key not in self.tables[table]]
        count = process_count(len(todo), per_process, limit)
        if count <= 1:
            return None
        started = start_slices(_stamp_and_parse(todo, parse, stamp), len(todo), count)
        return StartedPrefill(self, table, todo, started)

    def _keep_parsed(self, table: str, todo: list[str], parsed: list[tuple[Any, Any]]) -> int:
        for key, (signature, value) in zip(todo, parsed, strict=True):
            self._keep(table, key, signature, value)
        self.misses += len(todo)
        return len(todo)

    def save(self) -> None:
        """Write atomically when anything changed; entries not used this run are kept while their file exists."""
        if not self._dirty or self.path is None:
            return
        tables = {}
        for table in TABLES:
            used = self.used[table]
            kept = [
                (key, entry)
                for key, entry in self.tables[table].items()
                if key in used or os.path.exists(key)
            ]
            tables[table] = dict(kept[-MAX_ENTRIES[table] :])
        try:
            body = marshal.dumps(tables)
        except ValueError:  # a value of the wrong type: a bug, but never a reason to fail a check
            return
        try:
            _write_atomic(self.path, HEADER + _CRC.pack(zlib.crc32(body)) + body)
        except OSError:
            return
        self._dirty = False


def absorb(started: StartedPrefill | None) -> int:
    """Wait for a `start_prefill` and store what it parsed: how many keys (0 for None, nothing started)."""
    return started.absorb() if started is not None else 0


@dataclass
class StartedPrefill:
    """A `start_prefill` under way: `absorb()` waits for its children and stores what they parsed."""

    cache: ParseCache
    table: str
    todo: list[str]
    started: Started[list[tuple[Any, Any]]]

    def absorb(self) -> int:
        parsed = [pair for part in self.started.results() for pair in part]
        return self.cache._keep_parsed(self.table, self.todo, parsed)

    def cancel(self) -> None:
        self.started.cancel()


def _stamp_and_parse(
    todo: list[str], parse: Callable[[str], Any], stamp: Callable[[str], Any]
) -> Callable[[int, int], list[tuple[Any, Any]]]:
    """A slice's work: each key's stamp and, where its file is there, its parse."""

    def work(start: int, stop: int) -> list[tuple[Any, Any]]:
        out = []
        for key in todo[start:stop]:
            signature = stamp(key)
            out.append((signature, parse(key) if signature is not None else None))
        return out

    return work


def _is_stamp(value: Any) -> bool:
    return isinstance(value, tuple) and len(value) == 5 and all(isinstance(v, int) for v in value)


def _racy(stamp: Any) -> bool:
    """Whether a file behind this stamp (one Stamp, or a tuple of Stamp | None) changed too recently; a
    digest of content (a str) never is."""
    if isinstance(stamp, str):
        return False
    parts = [stamp] if _is_stamp(stamp) else [p for p in stamp if _is_stamp(p)]
    newest = max((max(p[1], p[3]) for p in parts), default=0)
    return newest > time.time_ns() - int(RACY_SECONDS * 1e9)


def _read_tables(path: Path) -> dict[str, dict[str, tuple[Any, Any]]] | None:
    try:
        with open(path, "rb") as handle:
            if os.fstat(handle.fileno()).st_uid != os.geteuid():
                return None  # someone else's file: not trusted, rebuilt on save
            data = handle.read()
    except OSError:
        return None
    return _read_tables_from_bytes(data)


def _read_tables_from_bytes(data: bytes) -> dict[str, dict[str, tuple[Any, Any]]] | None:
    if not data.startswith(HEADER) or len(data) < len(HEADER) + _CRC.size:
        return None
    (crc,) = _CRC.unpack_from(data, len(HEADER))
    body = memoryview(data)[len(HEADER) + _CRC.size :]
    if zlib.crc32(body) != crc:
        return None
    collecting = gc.isenabled()
    gc.disable()  # ~60k new tuples and strings, none of them cyclic: the collector's passes only cost time
    try:
        tables = marshal.loads(body)
    except (EOFError, ValueError, TypeError):
        return None
    finally:
        if collecting:
            gc.enable()
    if not isinstance(tables, dict) or set(tables) != set(TABLES):
        return None
    for rows in tables.values():
        if not isinstance(rows, dict):
            return None
        for entry in rows.values():
            if not isinstance(entry, tuple) or len(entry) != 2:
                return None
    return tables


def _write_atomic(path: Path, data: bytes) -> None:
    """Write beside the target and rename over it: readers see the old file or the new one, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
