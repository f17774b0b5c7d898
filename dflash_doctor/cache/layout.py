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
- below the top, what only a compiler writes (issue 37, F1: `kernel/attn.cu`, `triton/flash_attn.py`,
  `cache/thesis` borrow Inductor's folder names but not its keys): folders named by a key, two characters
  of one, or a device index (`triton/0/`); files named by a key (`f<key>`, `<system hash>`, `<key>.lock`);
  in a Triton key folder, Triton's kinds (`.ttir .ttgir .llir .ptx .cubin .json .so ...`) with its
  `.json` metadata; in `dynamo/`, PGO's `code_state_*.pkl`; anywhere, the temp file of a killed write
  (torch's `.<pid>.<thread>.tmp`, Triton's `<file>.tmp.pid_<pid>_<n>`);
- our own records at the top (marker, backup record, their temp files) count neither way.
An empty folder is a cache: nothing in it could be lost. A real cache with a few strays (an editor's swap
file, an NFS silly-rename, `__pycache__/`, a log, a core dump, a link: at most MAX_STRAYS, and STRAY_RATIO
compiler files for each; issue 37, F2) is a cache too: the strays are named, left out of a snapshot, and
the folder holding them is never deleted by retention. Layouts checked against real caches: torch 2.13 on
CPU, torch 2.11 with Triton 3.6 on an H200 (tests/cache/layouts/).

The walk goes through handles (`O_NOFOLLOW`, a link is judged by its name and never followed) and stops
once there are too many entries no compiler writes to be a cache. A folder nested deeper than MAX_DEPTH
(real caches nest 3) is a stray, not walked: a tree 1,200 deep ended the walk in a RecursionError, with a
handle open per level (issue 37, D1).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dflash_doctor.cache.archive import is_our_record
from dflash_doctor.cache.fsops import open_folder_at, printable
from dflash_doctor.cache.locations import TRANSIENT_FOLDERS
from dflash_doctor.cache.manifest import MAX_DEPTH

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
_DEVICE = re.compile(r"\d{1,3}")  # Inductor's triton/<device index>/
_TORCH_TEMP = re.compile(r"\.\d+\.\d+\.tmp")  # torch's write_atomic, killed before its rename
_TRITON_TEMP = re.compile(r".+\.tmp\.pid_\d+_\d+|tmp\.pid_\d+_[0-9a-f]+")
_WRAPPER_TEMP = re.compile(r"tmp[a-z0-9_]{8}\.py")  # a NamedTemporaryFile of Inductor's wrapper codegen
_DYNAMO_STATE = re.compile(r"code_state_.+\.pkl(\.lock)?")  # torch/_dynamo/pgo.py's code_state_path
# What Triton writes into one of its key folders: IRs, binaries, the launcher, and its metadata (.json).
TRITON_KINDS = frozenset(
    {"amdgcn", "bc", "c", "cubin", "hsaco", "json", "llir", "ptx", "so", "source", "spv", "ttgir", "ttir"}
)
# A cache may hold a few entries a compiler did not write (an editor's swap file, an NFS silly-rename,
# `__pycache__/`, a log, a core dump): it is still a cache when there are at most this many, and at least
# STRAY_RATIO compiler files for each. They are named, left out of a snapshot, and the folder they are in
# is kept out of retention when a restore replaces it (they may be a person's).
MAX_STRAYS = 8
STRAY_RATIO = 4


@dataclass
class CacheContent:
    """What a walk found: entries no compiler writes (relative paths, a folder with a trailing `/`; at
    most MAX_STRAYS + 1), how many files a snapshot would hold (our records and the transient `locks/`,
    `precompiled_headers/` left out), and how many files a compiler wrote in all."""

    strangers: list[str] = field(default_factory=list)
    more_strangers: bool = False
    too_deep: bool = False  # one of the strangers is a folder nested deeper than MAX_DEPTH
    files: int = 0
    compiled: int = 0

    @property
    def reason(self) -> str | None:
        """Why this is not a compile cache (None: it is one, perhaps with a few strays)."""
        if not self.strangers:
            return None
        few = not self.more_strangers and len(self.strangers) <= MAX_STRAYS
        if few and self.compiled >= STRAY_RATIO * len(self.strangers):
            return None
        return f"it holds what no compiler writes ({self.named()})"

    def named(self) -> str:
        """The first few strays, escaped, for a message."""
        shown = ", ".join(printable(name, 80) for name in self.strangers[:SAMPLE])
        shown += ", ..." if self.more_strangers or len(self.strangers) > SAMPLE else ""
        return shown + (f"; a folder nested more than {MAX_DEPTH} deep" if self.too_deep else "")


def _temp(name: str) -> bool:
    return _TORCH_TEMP.fullmatch(name) is not None or _TRITON_TEMP.fullmatch(name) is not None


def _keyed(name: str) -> bool:
    """Named by a key, of a compiler's kind or none (`c<key>.py`, `<sha256>.best_config`,
    `<key>.main.cpp`, `f<key>`), or a killed write's temp file: names no person gives."""
    if _temp(name):
        return True
    stem, dot, kind = name.partition(".")
    return _KEY.fullmatch(stem) is not None and (not dot or kind.rpartition(".")[2] in COMPILER_KINDS)


def _keyed_folder_rule(name: str) -> str | None:
    """The rule for a folder below the top: a Triton key folder, or one named by a key, two characters
    of a key, or a device index (whose entries are judged the same way)."""
    if _TRITON_KEY.fullmatch(name):
        return "triton"
    if _KEY.fullmatch(name) or _CODE_FOLDER.fullmatch(name) or _DEVICE.fullmatch(name) or name == "locks":
        return "keyed"
    return None


def _top_folder_rule(name: str) -> str | None:
    if name in INDUCTOR_FOLDERS:
        return "dynamo" if name == "dynamo" else "keyed"
    if _CODE_FOLDER.fullmatch(name):
        return "code"
    if _TRITON_KEY.fullmatch(name):
        return "triton"
    return None


def _top_file(name: str) -> bool:
    return (
        name in INDUCTOR_FILES
        or _WRAPPER_TEMP.fullmatch(name) is not None
        or _TORCH_TEMP.fullmatch(name) is not None
    )


def _file_rule(rule: str, name: str) -> bool:
    """A file a compiler writes in a folder of this rule."""
    if rule == "triton":
        stem, dot, kind = name.rpartition(".")
        return _temp(name) or (bool(dot) and bool(stem) and kind in TRITON_KINDS)
    if rule == "dynamo":
        return _DYNAMO_STATE.fullmatch(name) is not None or _keyed(name)
    return _keyed(name)


def _folder_rule(rule: str, name: str) -> str | None:
    """The rule for a subfolder `name` of a folder of this rule (None: no compiler makes it)."""
    if rule == "triton":
        return None  # Triton's key folders are flat
    if rule == "code":
        return "keyed" if _keyed(name) else None
    return _keyed_folder_rule(name)


class _Walk:
    """The content rule over an open folder (`examine`); `_Listed` runs the same rule over a list of paths."""

    def __init__(self) -> None:
        self.content = CacheContent()

    def entries(self, fd: Any) -> list[tuple[str, bool, bool]]:
        """(name, is a folder, is a regular file) of each entry of the folder `fd`."""
        with os.scandir(fd) as found:
            return [
                (entry.name, entry.is_dir(follow_symlinks=False), entry.is_file(follow_symlinks=False))
                for entry in found
            ]

    def enter(self, fd: Any, name: str) -> Any:
        return open_folder_at(fd, name)

    def leave(self, inner: Any) -> None:
        os.close(inner)

    def is_link(self, fd: Any, name: str) -> bool:
        return _is_link(fd, name)

    def stranger(self, path: str) -> bool:
        """Note one; True when there are too many to be a cache (the walk stops)."""
        if len(self.content.strangers) > MAX_STRAYS:
            self.content.more_strangers = True
            return True
        self.content.strangers.append(path)
        return False

    def folder(self, fd: Any, where: str, rule: str, counted: bool) -> bool:
        """Judge everything under the open folder `fd` (`where`: its path from the top); True to stop."""
        metadata = kernels = 0
        for name, is_dir, is_file in self.entries(fd):
            path = f"{where}/{name}"
            inner = _folder_rule(rule, name)
            if is_dir:
                if inner is None:
                    if self.stranger(path + "/"):
                        return True
                elif self._descend(fd, name, path, inner, counted):
                    return True
            elif not is_file:  # a link is judged by its name, never followed; anything else is a stray
                if not (self.is_link(fd, name) and (inner or _file_rule(rule, name))) and self.stranger(path):
                    return True
            elif not _file_rule(rule, name):
                if self.stranger(path):
                    return True
            else:
                self.content.compiled += 1
                kernels += not _temp(name) and not name.endswith(".so")
                metadata += name.endswith(".json")
                if counted:
                    self.content.files += 1
        # Triton writes its metadata with every kernel (a folder of its compiled utilities holds a .so alone)
        if rule == "triton" and kernels and not metadata:
            return self.stranger(where + "/")
        return False

    def _descend(self, fd: Any, name: str, path: str, rule: str, counted: bool) -> bool:
        if path.count("/") >= MAX_DEPTH:  # `path` is its folder's path from the top: depth = slashes + 1
            self.content.too_deep = True
            return self.stranger(path + "/")
        try:
            inner = self.enter(fd, name)
        except OSError:
            return self.stranger(path + "/")
        try:
            return self.folder(inner, path, rule, counted)
        finally:
            self.leave(inner)

    def top(self, fd: Any) -> None:
        folders = []
        for name, is_dir, is_file in self.entries(fd):
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
                self.content.compiled += 1
        for name, rule in folders:
            if self._descend(fd, name, name, rule, counted=name not in TRANSIENT_FOLDERS):
                return


def _is_link(fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


Tree = dict[str, "Tree | None"]  # a folder's entries: a subfolder's own, or None for a file


class _Listed(_Walk):
    """The rule over folders given as nested dicts (files None): what an archive's manifest lists."""

    def entries(self, fd: Any) -> list[tuple[str, bool, bool]]:
        return [(name, inner is not None, inner is None) for name, inner in fd.items()]

    def enter(self, fd: Any, name: str) -> Any:
        return fd[name]

    def leave(self, inner: Any) -> None:
        pass

    def is_link(self, fd: Any, name: str) -> bool:
        return False


def examine_listing(paths: Iterable[str]) -> CacheContent:
    """`examine` of the folder these relative file paths would make, read from a list (an archive's manifest)
    before anything is written: a restore refuses an archive whose files would not make a compile cache, since
    every later restore would refuse the folder it left (issue 58, H3)."""
    tree: Tree = {}
    for path in paths:
        folder = tree
        *parents, name = path.split("/")
        for part in parents:
            inner = folder.setdefault(part, {})
            if inner is None:  # a file and a folder of one name: the extraction refuses it
                inner = folder[part] = {}
            folder = inner
        folder.setdefault(name, None)
    walk = _Listed()
    walk.top(tree)
    return walk.content


def examine(folder_fd: int) -> CacheContent:
    """Walk the open folder `folder_fd` (the cache's top): what in it no compiler writes, how many files."""
    walk = _Walk()
    walk.top(folder_fd)
    return walk.content
