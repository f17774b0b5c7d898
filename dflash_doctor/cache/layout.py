"""Is a folder a compile cache? Decided by what is in it: Inductor's and Triton's own layout.

A restore moves the folder at TORCHINDUCTOR_CACHE_DIR aside and, restores later, deletes it; a snapshot
archives it and writes our marker into it. A folder of documents must never be taken for a cache: not
because its top-level names look like hashes (`ab/`, `my-thesis-drafts-2024/`), and not because our
marker is in it (`cache snapshot` used to write it into any folder; issue 30, N2). So every entry of the
tree must be one a compiler writes, where it writes it:

- at the top: Inductor's code folders, named by two characters of a key (`ab/`), holding only entries
  named by a key (`c<52 base32 characters>.py|.so|.cpp|...`, `<sha256>.best_config`); the folders
  Inductor names (`fxgraph`, `aotautograd`, `triton`, `locks`, `cache`, ...); Triton's key folders (52
  base32 capitals, or 32 to 64 hex digits in older Tritons); Inductor's few files (`memoizer_cache.*`,
  a wrapper's `tmpXXXXXXXX.py`);
- below the top, every file of a compiler's kind: an extension Inductor or Triton writes (`.py .so .cpp
  .h .gch .o .cubin .ptx .ttir .ttgir .llir .json .lock .best_config .pkl ...`), or no extension at all
  (fxgraph and aotautograd entries, `cache/<system hash>`: documents carry extensions), or the temp
  file of a killed write (torch's `.<pid>.<thread>.tmp`, Triton's `<file>.tmp.pid_<pid>_<n>`);
- our own records at the top (marker, backup record, their temp files) count neither way.
An empty folder is a cache: nothing in it could be lost. Layouts checked against real caches: torch
2.13 on CPU, torch 2.11 with Triton 3.6 on an H200 (tests/cache/layouts/).

The walk goes through handles (`O_NOFOLLOW`, a link is judged by its name and never followed) and stops
at the first few entries that no compiler writes.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field

from dflash_doctor.cache.archive import is_our_record
from dflash_doctor.cache.fsops import open_folder_at, printable
from dflash_doctor.cache.locations import TRANSIENT_FOLDERS

SAMPLE = 3  # entries a refusal names

# Inductor's named folders at a cache's top (torch 2.6-2.13: codecache, cpp_builder, autotune, cutlass,
# aoti, autoheuristic, the compiler bisector, Dynamo's profiles); `triton` holds `<device>/<key>/` or, with
# TRITON_CACHE_DIR pointed there, Triton's key folders.
INDUCTOR_FOLDERS = frozenset(
    {
        "aoti_eager",
        "aotautograd",
        "autoheuristic",
        "bisect",
        "cache",
        "cutedsl_compile_cache",
        "dynamo",
        "fxgraph",
        "gcc",
        "kernel",
        "locks",
        "pgo",
        "precompiled_headers",
        "torch_cutlass",
        "triton",
        "unhashed_kernel_inputs",
    }
)
INDUCTOR_FILES = frozenset({"memoizer_cache.json", "memoizer_cache.lock"})
# The last extension of a file a compiler writes (Inductor: sources, objects, libraries, headers and their
# precompiled form, kernels' JSON, locks, autotune picks and timings, pickled profiles, AOTI packages;
# Triton: its IRs, binaries, metadata), from the names torch 2.13's codecache, cpp_builder, runtime and
# Dynamo's PGO write under the cache folder.
COMPILER_KINDS = frozenset(
    {
        "a",
        "amdgcn",
        "asm",
        "bc",
        "best_config",
        "bin",
        "c",
        "cc",
        "cpp",
        "cu",
        "cubin",
        "cuh",
        "fatbin",
        "gch",
        "h",
        "hpp",
        "hsaco",
        "json",
        "kernel_perf",
        "ll",
        "llir",
        "lock",
        "o",
        "pch",
        "pkl",
        "pt",
        "pt2",
        "ptx",
        "py",
        "pyc",
        "so",
        "source",
        "spv",
        "ttgir",
        "ttir",
        "txt",
    }
)
_CODE_FOLDER = re.compile(r"[a-z0-9]{2}")
_KEY = re.compile(r"[a-z0-9]{20,}|[A-Z2-7]{20,}")  # Inductor's lowercase base32 keys, hex digests
_TRITON_KEY = re.compile(r"[A-Z2-7]{52}|[0-9a-f]{32,64}")
_TORCH_TEMP = re.compile(r"\.\d+\.\d+\.tmp")  # torch's write_atomic, killed before its rename
_TRITON_TEMP = re.compile(r".+\.tmp\.pid_\d+_\d+|tmp\.pid_\d+_[0-9a-f]+")
_WRAPPER_TEMP = re.compile(r"tmp[a-z0-9_]{8}\.py")  # a NamedTemporaryFile of Inductor's wrapper codegen


@dataclass
class CacheContent:
    """What a walk found: entries no compiler writes (a few, relative paths), and how many files a
    snapshot would hold (our records and the transient `locks/`, `precompiled_headers/` left out)."""

    strangers: list[str] = field(default_factory=list)
    more_strangers: bool = False
    files: int = 0

    @property
    def reason(self) -> str | None:
        """Why this is not a compile cache (None: it is one)."""
        if not self.strangers:
            return None
        shown = ", ".join(printable(name, 80) for name in self.strangers)
        return f"it holds what no compiler writes ({shown}{', ...' if self.more_strangers else ''})"


def _compiler_file(name: str) -> bool:
    """A file below the top: a compiler's kind by its extension; without one (fxgraph and aotautograd
    entries, `cache/<system hash>`) any name: documents carry extensions."""
    if _TORCH_TEMP.fullmatch(name) or _TRITON_TEMP.fullmatch(name):
        return True
    stem, dot, kind = name.rpartition(".")
    return not dot or (bool(stem) and kind in COMPILER_KINDS)


def _keyed(name: str) -> bool:
    """An entry of a code folder: named by a key (`c<key>.py`, `<sha256>.best_config`, `<key>.main.cpp`)."""
    return _TORCH_TEMP.fullmatch(name) is not None or _KEY.fullmatch(name.partition(".")[0]) is not None


def _top_folder_rule(name: str) -> str | None:
    if name in INDUCTOR_FOLDERS:
        return "named"
    if _CODE_FOLDER.fullmatch(name):
        return "code"
    if _TRITON_KEY.fullmatch(name):
        return "named"
    return None


def _top_file(name: str) -> bool:
    return (
        name in INDUCTOR_FILES
        or _WRAPPER_TEMP.fullmatch(name) is not None
        or _TORCH_TEMP.fullmatch(name) is not None
    )


class _Walk:
    def __init__(self) -> None:
        self.content = CacheContent()

    def stranger(self, path: str) -> bool:
        """Note one; True when enough are known to stop."""
        if len(self.content.strangers) >= SAMPLE:
            self.content.more_strangers = True
            return True
        self.content.strangers.append(path)
        return False

    def folder(self, fd: int, where: str, code_folder: bool, counted: bool) -> bool:
        """Judge everything under the open folder `fd` (`where`: its path from the top); True to stop."""
        with os.scandir(fd) as found:
            entries = [
                (entry.name, entry.is_dir(follow_symlinks=False), entry.is_file(follow_symlinks=False))
                for entry in found
            ]
        for name, is_dir, is_file in entries:
            path = f"{where}/{name}"
            if code_folder and not _keyed(name):
                if self.stranger(path + ("/" if is_dir else "")):
                    return True
                continue
            if is_dir:
                if self._descend(fd, name, path, code_folder=False, counted=counted):
                    return True
            elif not _compiler_file(name) or not (is_file or _is_link(fd, name)):
                if self.stranger(path):
                    return True
            elif counted and is_file:
                self.content.files += 1
        return False

    def _descend(self, fd: int, name: str, path: str, code_folder: bool, counted: bool) -> bool:
        try:
            inner = open_folder_at(fd, name)
        except OSError:
            return self.stranger(path + "/")
        try:
            return self.folder(inner, path, code_folder, counted)
        finally:
            os.close(inner)

    def top(self, fd: int) -> None:
        with os.scandir(fd) as found:
            entries = [
                (entry.name, entry.is_dir(follow_symlinks=False), entry.is_file(follow_symlinks=False))
                for entry in found
            ]
        folders = []
        for name, is_dir, is_file in entries:
            if is_our_record(name):
                continue
            rule = _top_folder_rule(name) if is_dir else None
            if rule is not None:
                folders.append((name, rule))
            elif is_dir or not is_file or not _top_file(name):
                if self.stranger(name + ("/" if is_dir else "")):
                    return
            else:
                self.content.files += 1
        # every name at the top before anything below it: a folder of documents is told at once
        if self.content.strangers:
            return
        for name, rule in folders:
            if self._descend(
                fd, name, name, code_folder=rule == "code", counted=name not in TRANSIENT_FOLDERS
            ):
                return


def _is_link(fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def examine(folder_fd: int) -> CacheContent:
    """Walk the open folder `folder_fd` (the cache's top): what in it no compiler writes, how many files."""
    walk = _Walk()
    walk.top(folder_fd)
    return walk.content


def examine_path(path: str | os.PathLike[str]) -> CacheContent | None:
    """`examine` of the folder at `path` (opened without following a link); None when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return examine(fd)
    finally:
        os.close(fd)
