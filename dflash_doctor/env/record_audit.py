"""Do the files on disk still match what each distribution's RECORD says it installed?

pip lets a second distribution overwrite a file another one owns (the cu12 and cu13 NCCL twins both
install `nvidia/nccl/lib/libnccl.so.2`), and `pip uninstall` of one twin deletes the file the other
still lists. Neither shows in `pip check`. So we read every RECORD: files claimed twice, files gone,
files whose size (cheap, every file) or sha256 (costly, only the files that matter) differ.
"""

from __future__ import annotations

import fnmatch
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dflash_doctor.env.distributions import Distribution, RecordEntry, RecordRow
from dflash_doctor.env.file_hashes import HashCache
from dflash_doctor.env.size_survey import (
    RowRef,
    StatFacts,
    Survey,
    SurveyRun,
    is_audited,
    is_shared_library,
    start_survey,
    survey,
)

if TYPE_CHECKING:
    from dflash_doctor.env.parse_cache import ParseCache

# What torch's `_preload_cuda_deps` dlopens from `nvidia/*/lib`: the libraries worth a full sha256
# when nobody told us which libraries the loader really resolves.
TORCH_PRELOADED_LIBRARIES = (
    "libcublasLt.so.*",
    "libcublas.so.*",
    "libcudnn.so.*",
    "libnvrtc.so.*",
    "libcudart.so.*",
    "libcupti.so.*",
    "libcufft.so.*",
    "libcurand.so.*",
    "libnvJitLink.so.*",
    "libcusparse.so.*",
    "libcusparseLt.so.*",
    "libcusolver.so.*",
    "libnccl.so.*",
    "libnvshmem_host.so.*",
    "libcufile.so.*",
)


EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def is_namespace_marker(row: RecordRow) -> bool:
    """An empty `__init__.py` (`nvidia/__init__.py`, which eleven cu12 wheels each ship).

    Identical in every owner, so sharing it costs nothing; and without it Python imports the folder as
    a namespace package, so its absence breaks nothing (pip deletes it when one owner is upgraded to a
    version that no longer ships it, while the others still list it).
    """
    return row[0].endswith("__init__.py") and (row[2] == 0 or row[1] == EMPTY_SHA256)


def audited_record_rows(dist: Distribution) -> list[RecordRow]:
    """RECORD rows worth checking: no bytecode (rewritten at will), no RECORD itself, no hashless rows."""
    record = record_path(dist)
    return [row for row in dist.record_rows if is_audited(row, record)]


def audited_rows(dist: Distribution) -> list[RecordEntry]:
    """`audited_record_rows` as RecordEntry (named fields)."""
    return list(map(RecordEntry._make, audited_record_rows(dist)))


def record_path(dist: Distribution) -> str:
    """The RECORD file as its own RECORD lists it (normalised)."""
    return os.path.normpath(os.path.join(dist.dist_info, "RECORD"))


def is_preloaded_cuda_library(path: str) -> bool:
    """`.../nvidia/<folder>/lib/libnccl.so.2` and the like."""
    if "nvidia" not in path:  # what nearly every one of ~20k paths answers, without splitting
        return False
    parts = path.split(os.sep)
    if len(parts) < 4 or parts[-2] != "lib" or parts[-4] != "nvidia":
        return False
    return any(fnmatch.fnmatchcase(parts[-1], pattern) for pattern in TORCH_PRELOADED_LIBRARIES)


@dataclass(frozen=True)
class SharedFile:
    """One path that two or more distributions' RECORDs claim."""

    path: str
    owners: tuple[str, ...]
    present: bool
    matches: tuple[str, ...]  # owners whose RECORD sha256 equals the bytes on disk
    same_content: bool  # every owner's RECORD gives the same sha256: harmless but for uninstalls


@dataclass(frozen=True)
class ChangedFile:
    """A single-owner file whose bytes differ from its RECORD row."""

    path: str
    expected_size: int | None
    actual_size: int
    expected_sha256: str | None
    actual_sha256: str | None  # None when only the size was compared

    @property
    def how(self) -> str:
        if self.expected_size is not None and self.expected_size != self.actual_size:
            return f"size {self.actual_size} != RECORD {self.expected_size}"
        return f"sha256 {(self.actual_sha256 or '?')[:12]} != RECORD {(self.expected_sha256 or '?')[:12]}"


@dataclass
class RecordAudit:
    shared: list[SharedFile] = field(default_factory=list)
    missing: dict[str, list[str]] = field(default_factory=dict)  # distribution key -> files gone
    namespace_missing: list[str] = field(default_factory=list)  # empty `__init__.py` files gone: harmless
    changed: dict[str, list[ChangedFile]] = field(default_factory=dict)
    files_checked: int = 0
    files_hashed: int = 0
    cache_hits: int = 0
    bytes_hashed: int = 0
    seconds: float = 0.0
    processes: int = 1  # how many processes stat'ed the files (size_survey)
    stat_beside: bool = False  # the stat ran in children started before the checks (`start_record_survey`)

    def twins_of(self, key: str) -> set[str]:
        """Distributions that share at least one file with `key`."""
        return {o for s in self.shared if key in s.owners for o in s.owners if o != key}

    def timing(self) -> dict[str, object]:
        return {
            "files_checked": self.files_checked,
            "files_hashed": self.files_hashed,
            "hash_cache_hits": self.cache_hits,
            "mib_hashed": round(self.bytes_hashed / 2**20, 1),
            "seconds": round(self.seconds, 3),
            "processes": self.processes,
            "stat_beside_checks": self.stat_beside,
        }


@dataclass
class RecordRows:
    """Every distribution's RECORD rows as they are, one list each, in distribution order: what the survey's
    (list, row) positions index. Made without walking the ~50k rows (the survey's children pick the audited
    ones), so a warm `check`'s own process neither pays for the walk nor writes the pages the children share."""

    keys: list[str]
    rows: list[list[RecordRow]]
    records: list[str]  # each list's RECORD file, which its rows list without a hash

    @classmethod
    def of(cls, distributions: Mapping[str, Distribution]) -> RecordRows:
        keys = list(distributions)
        dists = [distributions[key] for key in keys]
        return cls(keys, [d.record_rows for d in dists], [record_path(d) for d in dists])

    def row(self, ref: RowRef) -> RecordRow:
        return self.rows[ref[0]][ref[1]]


# The parse cache's entry for the paths several audited rows claim (table "derived"), stamped with every
# RECORD's signature in distribution order: pip rewrites a RECORD whenever it installs or removes anything.
SEVERAL_KEY = "record-paths-claimed-twice"

Claims = dict[str, list[tuple[str, RecordRow]]]  # path -> (owner, row) of each row that lists it


def several_claims(
    distributions: Mapping[str, Distribution], rows: RecordRows, cache: ParseCache | None = None
) -> Claims:
    """The paths two or more audited rows list (twins; a RECORD repeating a row), with each row's owner: found
    by a walk of every row on a first run, read back from the parse cache while no RECORD has changed."""
    stamps = tuple(distributions[key].record_stamp for key in rows.keys)
    if cache is not None and all(stamp is not None for stamp in stamps):
        claims = _expand_claims(cache.get("derived", SEVERAL_KEY, stamps, lambda: _find_claims(rows)), rows)
        if claims is not None:
            return claims
    return _expand_claims(_find_claims(rows), rows) or {}


def _find_claims(rows: RecordRows) -> list[tuple[str, list[tuple[str, int]]]]:
    """(path, [(owner, row number), ...]) for every path more than one audited row lists."""
    first: dict[str, tuple[str, int]] = {}
    several: dict[str, list[tuple[str, int]]] = {}
    for key, listed, record in zip(rows.keys, rows.rows, rows.records, strict=True):
        for row_no, row in enumerate(listed):
            if not is_audited(row, record):
                continue
            seen = first.setdefault(row[0], (key, row_no))
            if seen != (key, row_no):
                several.setdefault(row[0], [seen]).append((key, row_no))
    return list(several.items())


def _expand_claims(stored: object, rows: RecordRows) -> Claims | None:
    """`_find_claims`' answer with the rows themselves; None when it does not fit these rows (rebuilt)."""
    at = dict(zip(rows.keys, rows.rows, strict=True))
    claims: Claims = {}
    try:
        for path, owners in stored:  # type: ignore[attr-defined]
            claims[path] = [(key, at[key][row_no]) for key, row_no in owners]
            if any(row[0] != path for _, row in claims[path]):
                return None
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return claims


@dataclass
class StartedSurvey:
    """The stat of every audited row, started beside the other checks (`start_record_survey`)."""

    rows: RecordRows
    run: SurveyRun

    def cancel(self) -> None:
        self.run.cancel()


def start_record_survey(distributions: Mapping[str, Distribution]) -> StartedSurvey:
    """Start the stat of every audited row in forked children now; `audit_records(started=...)` takes it."""
    rows = RecordRows.of(distributions)
    return StartedSurvey(rows, start_survey(rows.rows, rows.records))


def audit_records(
    distributions: Mapping[str, Distribution],
    cache: HashCache,
    hash_paths: Iterable[str] = (),
    started: StartedSurvey | None = None,
    parse_cache: ParseCache | None = None,
) -> RecordAudit:
    """Stat every audited RECORD file; sha256 the shared ones and those in `hash_paths`.

    `started`: their stat, started earlier by `start_record_survey` over the same distributions. `parse_cache`:
    where the paths several rows claim are kept between runs.
    """
    start = time.perf_counter()
    hits_before, misses_before, bytes_before = cache.hits, cache.misses, cache.bytes_hashed
    # A library may be named through a symlink (libfoo.so.2 -> libfoo.so.2.30.7): match both spellings.
    want_hash = {q for p in hash_paths for q in (os.path.normpath(p), os.path.realpath(p))}
    rows = started.rows if started is not None else RecordRows.of(distributions)
    found = started.run.result() if started is not None else survey(rows.rows, rows.records)
    several = several_claims(distributions, rows, parse_cache)

    installed_at: dict[str, tuple[int, int]] = {}
    claimed_twice = sum(len(owners) for owners in several.values())
    result = RecordAudit(
        files_checked=found.checked - claimed_twice + len(several),
        processes=found.processes,
        stat_beside=found.beside,
    )
    for ref in found.missing:
        row = rows.row(ref)
        if row[0] in several:
            continue
        if is_namespace_marker(row):
            result.namespace_missing.append(row[0])
        else:
            result.missing.setdefault(rows.keys[ref[0]], []).append(row[0])
    for ref, on_disk in found.resized:
        row = rows.row(ref)
        if row[0] not in several:
            result.changed.setdefault(rows.keys[ref[0]], []).append(
                ChangedFile(row[0], row[2], on_disk, row[1], None)
            )
    for ref, (on_disk, mtime_ns, ctime_ns) in sorted(_wanted_facts(rows, several, want_hash, found).items()):
        row, key = rows.row(ref), rows.keys[ref[0]]
        if _changed_since_install(mtime_ns, ctime_ns, distributions[key], installed_at):
            actual = cache.digest(row[0])
            if actual is not None and actual != row[1]:
                result.changed.setdefault(key, []).append(
                    ChangedFile(row[0], row[2], on_disk, row[1], actual)
                )
    for path, owners in several.items():
        try:
            size: int | None = os.stat(path).st_size
        except OSError:
            size = None
        if all(is_namespace_marker(row) for _, row in owners):
            if size is None:
                result.namespace_missing.append(path)
            continue
        result.shared.append(_shared_file(path, owners, size, cache))
    result.shared.sort(key=lambda s: _libraries_first(s.path))
    result.namespace_missing.sort()
    for gone in result.missing.values():
        gone.sort(key=_libraries_first)
    for changed in result.changed.values():
        changed.sort(key=lambda c: _libraries_first(c.path))
    result.files_hashed = cache.misses - misses_before
    result.cache_hits = cache.hits - hits_before
    result.bytes_hashed = cache.bytes_hashed - bytes_before
    result.seconds = time.perf_counter() - start
    return result


def _wanted_facts(
    rows: RecordRows, several: Claims, want_hash: set[str], found: Survey
) -> dict[RowRef, StatFacts]:
    """The stat facts of each wanted library (one owner) whose size matched its RECORD: what the survey watched
    (every audited row with a `.so` name), and a stat here for a wanted row it did not (a library named
    otherwise; the rows are walked for those only)."""
    wanted = want_hash - several.keys()
    facts: dict[RowRef, StatFacts] = {}
    for ref, stat_facts in found.watched.items():
        if rows.row(ref)[0] in wanted:
            facts[ref] = stat_facts
    named_otherwise = {path for path in wanted if not is_shared_library(path)}
    if not named_otherwise:
        return facts
    accounted = {rows.row(ref) for ref in found.missing} | {rows.row(ref) for ref, _ in found.resized}
    for list_no, (listed, record) in enumerate(zip(rows.rows, rows.records, strict=True)):
        for row_no, row in enumerate(listed):
            if row[0] not in named_otherwise or row in accounted or not is_audited(row, record):
                continue
            try:
                st = os.stat(row[0])
            except OSError:
                continue
            if row[2] in (None, st.st_size):
                facts[(list_no, row_no)] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return facts


# A wholesale copy of an environment (`cp -al`, `cp -a`, an image layer unpacked) gives every file a new
# ctime within minutes of its RECORD's; a library swapped in later with an old mtime (`cp -p`) does not.
COPY_WINDOW_NS = 600 * 10**9


def _changed_since_install(
    mtime_ns: int, ctime_ns: int, dist: Distribution, installed_at: dict[str, tuple[int, int]]
) -> bool:
    """Was this file written after its owner's RECORD (pip writes RECORD last)?

    mtime first: a library whose mtime is not newer than its RECORD's was written by that install, and
    copies and image layers keep mtimes, so a fresh or copied environment hashes nothing. ctime (which
    cannot be set back) catches what mtime cannot: a file put there later with an old mtime (`cp -p`,
    `touch -d`), more than `COPY_WINDOW_NS` after the RECORD's own ctime.
    """
    if dist.dist_info not in installed_at:
        try:
            record = os.stat(os.path.join(dist.dist_info, "RECORD"))
            installed_at[dist.dist_info] = (record.st_mtime_ns, record.st_ctime_ns)
        except OSError:
            installed_at[dist.dist_info] = (-1, -1)
    mtime, ctime = installed_at[dist.dist_info]
    return mtime_ns > mtime or ctime_ns > ctime + COPY_WINDOW_NS


def _libraries_first(path: str) -> tuple[bool, str]:
    """Evidence order: the libraries a person cares about before headers and licences."""
    return (not is_shared_library(path), path)


def _shared_file(
    path: str, owners: list[tuple[str, RecordRow]], size: int | None, cache: HashCache
) -> SharedFile:
    names = tuple(sorted(key for key, _ in owners))
    same = len({row[1] for _, row in owners}) == 1
    if size is None:
        return SharedFile(path, names, False, (), same)
    actual = cache.digest(path)
    matches = tuple(sorted(key for key, row in owners if row[1] == actual))
    return SharedFile(path, names, True, matches, same)
