"""The audited environment as one read-only model: interpreter, distributions, torch build, file owners.

Built from files only, so it works when `import torch` is broken. Every check reads this model;
none of them touches the filesystem layout rules on its own. `Environment.load` (what the commands
use) reads dist-info, RECORD and ELF files through a persistent, stat-validated `ParseCache`;
`save_parse_cache()` writes what this run parsed anew.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property

from packaging.utils import canonicalize_name

from dflash_doctor.distributions import Distribution, RecordEntry, scan_distributions
from dflash_doctor.elf import ElfInfo, read_elf, read_elf_cached
from dflash_doctor.interpreter import InterpreterInfo, interpreter_for
from dflash_doctor.parse_cache import ParseCache
from dflash_doctor.torch_build import TorchBuild, read_torch_build


@dataclass
class Environment:
    interpreter: InterpreterInfo
    distributions: dict[str, Distribution]
    shadowed: list[Distribution] = field(default_factory=list)
    parse_cache: ParseCache | None = field(default=None, repr=False, compare=False)

    @classmethod
    def load(cls, python: str | None = None, cached: bool = True) -> Environment:
        """The environment of `python` (a path) or of the running interpreter.

        `cached`: parse through this environment's persistent ParseCache (call `save_parse_cache()`).
        """
        return cls.from_interpreter(interpreter_for(python), cached=cached)

    @classmethod
    def from_interpreter(
        cls, interpreter: InterpreterInfo, cached: bool = False, parse_cache: ParseCache | None = None
    ) -> Environment:
        site_dirs = interpreter.site_dirs
        if parse_cache is None and cached:
            parse_cache = ParseCache.for_site_dirs(site_dirs)
        visible, shadowed = scan_distributions(site_dirs, parse_cache)
        return cls(interpreter, visible, shadowed, parse_cache)

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
        owners: dict[str, list[str]] = defaultdict(list)
        for key, dist in self.distributions.items():
            for entry in dist.record:
                owners[entry.path].append(key)
        return dict(owners)

    @cached_property
    def record_entries(self) -> dict[tuple[str, str], RecordEntry]:
        """(distribution key, absolute path) -> its RECORD row."""
        rows: dict[tuple[str, str], RecordEntry] = {}
        for key, dist in self.distributions.items():
            for entry in dist.record:
                rows[(key, entry.path)] = entry
        return rows

    def owners_of(self, path: str) -> list[str]:
        """Who claims this file; looks through symlinks to the file the loader really maps."""
        norm = os.path.normpath(path)
        found = self.owners.get(norm)
        if found:
            return found
        real = os.path.realpath(norm)
        return self.owners.get(real, [])
