"""The audited environment as one read-only model: interpreter, distributions, torch build, file owners.

Built from files only, so it works when `import torch` is broken. Every check reads this model;
none of them touches the filesystem layout rules on its own. `Environment.load` (what the commands
use) reads dist-info, RECORD and ELF files through a persistent, stat-validated `ParseCache`;
`save_parse_cache()` writes what this run parsed anew.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

from packaging.utils import canonicalize_name

from dflash_doctor.env.distributions import Distribution, read_record_rows, scan_distributions
from dflash_doctor.env.elf import ElfInfo, read_elf, read_elf_cached, read_elf_facts
from dflash_doctor.env.interpreter import InterpreterInfo, InterpreterProbe, interpreter_for
from dflash_doctor.env.parse_cache import ParseCache, StartedPrefill, absorb
from dflash_doctor.env.torch_build import TorchBuild, read_torch_build

# A first `check` reads what the parse cache lacks in forked processes (`ParseCache.start_prefill`), this many files a
# process at least: a fork costs ~2 ms; a RECORD ~1-3 ms to read and parse, an ELF header ~0.4 ms from a cold disk.
RECORDS_PER_PROCESS = 24
ELF_FILES_PER_PROCESS = 96


@dataclass
class Environment:
    interpreter: InterpreterInfo
    distributions: dict[str, Distribution]
    shadowed: list[Distribution] = field(default_factory=list)
    parse_cache: ParseCache | None = field(default=None, repr=False, compare=False)

    @classmethod
    def load(
        cls, python: str | None = None, cached: bool = True, probe: InterpreterProbe | None = None
    ) -> Environment:
        """The environment of `python` (a path) or of the running interpreter.

        `cached`: parse through this environment's persistent ParseCache (call `save_parse_cache()`).
        `probe`: the probe of `python` already started (`InterpreterProbe(python)`), to collect.
        """
        info = probe.result() if probe is not None else interpreter_for(python)
        return cls.from_interpreter(info, cached=cached)

    @classmethod
    def from_interpreter(
        cls, interpreter: InterpreterInfo, cached: bool = False, parse_cache: ParseCache | None = None
    ) -> Environment:
        site_dirs = interpreter.site_dirs
        if parse_cache is None and cached:
            parse_cache = ParseCache.for_site_dirs(site_dirs)
        visible, shadowed = scan_distributions(site_dirs, parse_cache)
        return cls(interpreter, visible, shadowed, parse_cache)

    def prefetch_records(self) -> int:
        """Parse every RECORD the parse cache has never seen, in forked processes (a first `check`), so that
        `Distribution.record_rows` finds them; how many were parsed here (0: nothing to do, or not forked)."""
        if self.parse_cache is None:
            return 0
        site_of = {os.path.join(d.dist_info, "RECORD"): d.site_dir for d in self.distributions.values()}
        started = self.parse_cache.start_prefill(
            "records", list(site_of), lambda path: read_record_rows(path, site_of[path]), RECORDS_PER_PROCESS
        )
        return absorb(started)

    def prefetch_elf(self, paths: list[str]) -> int:
        """The dynamic sections of `paths` the parse cache has never seen, read in forked processes; how many."""
        return absorb(self.start_prefetch_elf(paths))

    def start_prefetch_elf(self, paths: list[str]) -> StartedPrefill | None:
        """`prefetch_elf` begun in forked children beside other work (`absorb()` it before reading); None when
        the parse cache has them all (a warm run) or there are too few to fork for."""
        if self.parse_cache is None:
            return None
        return self.parse_cache.start_prefill("elf", paths, read_elf_facts, ELF_FILES_PER_PROCESS)

    def read_elf(self, path: str) -> ElfInfo | None:
        """`elf.read_elf`, through the parse cache when this environment has one."""
        if self.parse_cache is None:
            return read_elf(path)
        return read_elf_cached(path, self.parse_cache)

    def save_parse_cache(self) -> None:
        """Persist what this run parsed anew (nothing is written when everything came from the cache)."""
        if self.parse_cache is not None:
            self.parse_cache.save()

    def get(self, name: str) -> Distribution | None:
        return self.distributions.get(canonicalize_name(name))

    @cached_property
    def torch_dir(self) -> str | None:
        """The `torch` package folder that `import torch` would pick (first on sys.path)."""
        for site_dir in self.interpreter.site_dirs:
            candidate = os.path.join(site_dir, "torch")
            if os.path.isfile(os.path.join(candidate, "version.py")):
                return candidate
        return None

    @cached_property
    def torch(self) -> TorchBuild | None:
        return read_torch_build(self.torch_dir) if self.torch_dir else None

    @cached_property
    def torch_dist(self) -> Distribution | None:
        return self.get("torch")

    @cached_property
    def owners(self) -> dict[str, list[str]]:
        """Absolute file path -> keys of every visible distribution whose RECORD lists it."""
        first, several = self._owner_index
        owners = {path: [key] for path, key in first.items()}
        owners.update((path, list(keys)) for path, keys in several.items())
        return owners

    @cached_property
    def _owner_index(self) -> tuple[dict[str, str], dict[str, list[str]]]:
        """(path -> the first distribution listing it, path -> all of them where more than one does).

        The same content as `owners`, built with one `dict.fromkeys` per distribution instead of a
        list per row (~50k rows); only a RECORD that shares paths (twins) or repeats one goes row by row.
        """
        return _index_owners(
            (key, [row[0] for row in dist.record_rows]) for key, dist in self.distributions.items()
        )

    @cached_property
    def library_paths(self) -> dict[str, list[str]]:
        """Distribution key -> the paths its RECORD lists with `.so` in them (shared libraries and what else
        has those letters), in RECORD order: the loader's questions are about these few thousand of ~50k rows."""
        return {
            key: [row[0] for row in dist.record_rows if ".so" in row[0]]
            for key, dist in self.distributions.items()
        }

    @cached_property
    def _library_owner_index(self) -> tuple[dict[str, str], dict[str, list[str]]]:
        """`_owner_index` of `library_paths` alone: complete for any path with `.so` in it."""
        return _index_owners(self.library_paths.items())

    @cached_property
    def _realpaths(self) -> dict[str, str]:
        return {}

    def _owners(self, path: str) -> list[str]:
        # the loader asks about libraries again and again: their index is built from a tenth of the rows
        first, several = self._library_owner_index if ".so" in path else self._owner_index
        if path in several:
            return several[path]
        key = first.get(path)
        return [] if key is None else [key]

    def owners_of(self, path: str) -> list[str]:
        """Who claims this file; looks through symlinks to the file the loader really maps."""
        norm = os.path.normpath(path)
        found = self._owners(norm)
        if found:
            return found
        real = self._realpaths.get(norm)
        if (
            real is None
        ):  # realpath lstats every component; the loader asks for the same files again and again
            real = self._realpaths[norm] = os.path.realpath(norm)
        return self._owners(real)


def _index_owners(listings: Iterable[tuple[str, list[str]]]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """(path -> the first key listing it, path -> every key where more than one does, or one lists it twice)."""
    first: dict[str, str] = {}
    several: dict[str, list[str]] = {}
    for key, paths in listings:
        mine = dict.fromkeys(paths, key)
        if len(mine) == len(paths) and mine.keys().isdisjoint(first.keys()):
            first.update(mine)
            continue
        for path in paths:  # in RECORD order; a path listed twice counts twice, as it always did
            if path in several:
                several[path].append(key)
            elif path in first:
                several[path] = [first[path], key]
            else:
                first[path] = key
    return first, several
