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
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from dflash_doctor.distributions import Distribution, RecordEntry
from dflash_doctor.file_hashes import HashCache

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


def audited_rows(dist: Distribution) -> list[RecordEntry]:
    """RECORD rows worth checking: no bytecode (rewritten at will), no RECORD itself, no hashless rows."""
    record = os.path.normpath(os.path.join(dist.dist_info, "RECORD"))
    rows = []
    for entry in dist.record:
        if entry.sha256 is None or entry.path == record:
            continue
        if entry.path.endswith(".pyc") or f"{os.sep}__pycache__{os.sep}" in entry.path:
            continue
        rows.append(entry)
    return rows


def is_preloaded_cuda_library(path: str) -> bool:
    """`.../nvidia/<folder>/lib/libnccl.so.2` and the like."""
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
    changed: dict[str, list[ChangedFile]] = field(default_factory=dict)
    files_checked: int = 0
    files_hashed: int = 0
    cache_hits: int = 0
    bytes_hashed: int = 0
    seconds: float = 0.0

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
        }


def audit_records(
    distributions: Mapping[str, Distribution],
    cache: HashCache,
    hash_paths: Iterable[str] = (),
) -> RecordAudit:
    """Stat every audited RECORD file; sha256 the shared ones and those in `hash_paths`."""
    start = time.perf_counter()
    hits_before, misses_before, bytes_before = cache.hits, cache.misses, cache.bytes_hashed
    # A library may be named through a symlink (libfoo.so.2 -> libfoo.so.2.30.7): match both spellings.
    want_hash = {q for p in hash_paths for q in (os.path.normpath(p), os.path.realpath(p))}
    claims: dict[str, list[tuple[str, RecordEntry]]] = defaultdict(list)
    for key, dist in distributions.items():
        for entry in audited_rows(dist):
            claims[entry.path].append((key, entry))

    installed_at: dict[str, int] = {}
    result = RecordAudit()
    for path, owners in claims.items():
        result.files_checked += 1
        try:
            stat: os.stat_result | None = os.stat(path)
        except OSError:
            stat = None
        size = stat.st_size if stat is not None else None
        if len(owners) > 1:
            result.shared.append(_shared_file(path, owners, size, cache))
            continue
        key, entry = owners[0]
        if size is None:
            result.missing.setdefault(key, []).append(path)
        elif entry.size is not None and entry.size != size:
            result.changed.setdefault(key, []).append(ChangedFile(path, entry.size, size, entry.sha256, None))
        elif path in want_hash and _changed_since_install(stat, distributions[key], installed_at):
            actual = cache.digest(path)
            if actual is not None and actual != entry.sha256:
                result.changed.setdefault(key, []).append(
                    ChangedFile(path, entry.size, size, entry.sha256, actual)
                )
    result.shared.sort(key=lambda s: _libraries_first(s.path))
    for gone in result.missing.values():
        gone.sort(key=_libraries_first)
    for changed in result.changed.values():
        changed.sort(key=lambda c: _libraries_first(c.path))
    result.files_hashed = cache.misses - misses_before
    result.cache_hits = cache.hits - hits_before
    result.bytes_hashed = cache.bytes_hashed - bytes_before
    result.seconds = time.perf_counter() - start
    return result


def _changed_since_install(
    stat: os.stat_result | None, dist: Distribution, installed_at: dict[str, int]
) -> bool:
    """Was this file written after its owner's RECORD (pip writes RECORD last)?

    ctime moves on every write and on `touch`/`cp -p`, and cannot be set back, so a library whose
    ctime is not newer than its RECORD's has its installed bytes: no need to hash 500 MB to know.
    A wholesale copy of the environment makes every ctime new: those files are hashed once and cached.
    """
    if stat is None:
        return False
    if dist.dist_info not in installed_at:
        try:
            installed_at[dist.dist_info] = os.stat(os.path.join(dist.dist_info, "RECORD")).st_ctime_ns
        except OSError:
            installed_at[dist.dist_info] = -1
    return stat.st_ctime_ns > installed_at[dist.dist_info]


def is_shared_library(path: str) -> bool:
    name = os.path.basename(path)
    return name.endswith(".so") or ".so." in name


def _libraries_first(path: str) -> tuple[bool, str]:
    """Evidence order: the libraries a person cares about before headers and licences."""
    return (not is_shared_library(path), path)


def _shared_file(
    path: str, owners: list[tuple[str, RecordEntry]], size: int | None, cache: HashCache
) -> SharedFile:
    names = tuple(sorted(key for key, _ in owners))
    same = len({entry.sha256 for _, entry in owners}) == 1
    if size is None:
        return SharedFile(path, names, False, (), same)
    actual = cache.digest(path)
    matches = tuple(sorted(key for key, entry in owners if entry.sha256 == actual))
    return SharedFile(path, names, True, matches, same)
