"""`why PACKAGE`: what a distribution's libraries do for torch, and what breaks without them.

It answers from the same LibraryReport as `check`, then re-runs the same simulation with the
package's files hidden (a pure what-if; nothing is uninstalled) and compares the two.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from packaging.utils import canonicalize_name

from dflash_base.errors import DoctorError
from dflash_doctor.env.distributions import Distribution
from dflash_doctor.env.environment import Environment
from dflash_doctor.libs.ldcache import LdCache, load_system_cache
from dflash_doctor.libs.loader import PRELOAD_REQUESTER, LibraryReport, Resolution, resolve_torch_libraries

_SHARED_OBJECT = re.compile(r"\.so(\.\d+)*$")
_EXTRA = re.compile(r"""extra\s*==\s*['"]([^'"]+)['"]""")

WHY_SCHEMA = "dflash-doctor/why/v1"


@dataclass(frozen=True)
class ProvidedLibrary:
    """One shared object the package installs, and its role in the simulated process."""

    soname: str
    path: str
    needed_by: tuple[str, ...]
    loaded: bool  # this very file is what the process ends up with for the soname
    loaded_copy: str | None  # the file the process loads instead, when another copy wins
    other_owners: tuple[str, ...]  # distributions whose RECORD also lists this path
    without: str  # what the loader does without the package: a path, or "missing"
    without_via: str

    def to_json(self) -> dict[str, object]:
        return {
            "soname": self.soname,
            "path": self.path,
            "needed_by": list(self.needed_by),
            "loaded": self.loaded,
            "loaded_copy": self.loaded_copy,
            "other_owners": list(self.other_owners),
            "without": self.without,
            "without_via": self.without_via,
        }


@dataclass
class PackageExplanation:
    """The answer to `dflash-doctor why NAME`."""

    name: str
    version: str
    libraries: list[ProvidedLibrary] = field(default_factory=list)
    required_by: list[str] = field(default_factory=list)
    import_error_without: str | None = None
    import_error_now: str | None = None
    newly_missing: list[str] = field(default_factory=list)  # "soname (needed by X, stage)"

    @property
    def load_bearing(self) -> bool:
        """Removing it makes some lookup fail that succeeds today."""
        return bool(self.newly_missing) or (self.import_error_without != self.import_error_now)

    @property
    def verdict(self) -> str:
        if self.import_error_without and self.import_error_without != self.import_error_now:
            return f"load-bearing: without it `import torch` fails with {self.import_error_without}"
        if self.newly_missing:
            return "load-bearing: without it " + "; ".join(self.newly_missing) + " resolve nowhere"
        used = [lib for lib in self.libraries if lib.needed_by]
        if not self.libraries:
            return "provides no shared libraries"
        if not used:
            return "no library of torch's process needs its shared libraries"
        fallbacks = sorted({f"{lib.soname} -> {lib.without}" for lib in used if lib.without != "missing"})
        return "not load-bearing: the loader would fall back to " + ", ".join(fallbacks)

    def to_json(self) -> dict[str, object]:
        return {
            "schema": WHY_SCHEMA,
            "name": self.name,
            "version": self.version,
            "verdict": self.verdict,
            "load_bearing": self.load_bearing,
            "required_by": self.required_by,
            "libraries": [lib.to_json() for lib in self.libraries],
            "import_error_without": self.import_error_without,
            "newly_missing": self.newly_missing,
        }


def _required_by(env: Environment, target: Distribution) -> list[str]:
    """Which installed distributions require `target`, naming the extras that pull it in."""
    out = []
    for dist in env.distributions.values():
        specs: dict[str, set[str]] = {}
        for req in dist.requirements:
            if canonicalize_name(req.name) == target.key:
                extras = specs.setdefault(f"{req.name}{req.specifier}", set())
                extras.update(_EXTRA.findall(str(req.marker or "")))
        for spec, extras in specs.items():
            via = (
                f" (through its extra{'s' if len(extras) > 1 else ''} {', '.join(sorted(extras))})"
                if extras
                else ""
            )
            out.append(f"{dist.name} {dist.version}: {spec}{via}")
    return sorted(out)


def _shared_objects(env: Environment, dist: Distribution) -> list[tuple[str, str]]:
    """(soname, path) of every ELF shared object the distribution's RECORD lists."""
    found = []
    for entry in dist.record:
        if _SHARED_OBJECT.search(entry.path):
            info = env.read_elf(entry.path)
            if info is not None:
                found.append((info.name, entry.path))
    return found


def _short(path: str) -> str:
    return f"{PRELOAD_REQUESTER} (preload)" if path == PRELOAD_REQUESTER else os.path.basename(path)


def explain_package(env: Environment, name: str, ldcache: LdCache | None = None) -> PackageExplanation:
    """What `name` provides to torch's process and what the loader would do without it."""
    dist = env.get(name)
    if dist is None:
        raise DoctorError(
            f"no distribution named {name!r} is installed for {env.interpreter.executable}",
            hint="names as pip shows them, e.g. `dflash-doctor why nvidia-cudnn-cu13`",
        )
    cache = ldcache if ldcache is not None else load_system_cache()
    now = resolve_torch_libraries(env, ldcache=cache)
    files = {os.path.normpath(e.path) for e in dist.record}
    without = resolve_torch_libraries(env, ldcache=cache, hidden=lambda p: p in files)
    explanation = PackageExplanation(
        dist.name,
        dist.version,
        required_by=_required_by(env, dist),
        import_error_without=without.import_error,
        import_error_now=now.import_error,
        newly_missing=_newly_missing(now, without),
    )
    for soname, path in _shared_objects(env, dist):
        winner = now.effective(soname)
        fallback = without.effective(soname)
        explanation.libraries.append(
            ProvidedLibrary(
                soname=soname,
                path=path,
                needed_by=tuple(_short(r) for r in now.requesters_of(soname)),
                loaded=winner is not None and winner.path == os.path.normpath(path),
                loaded_copy=winner.path if winner and winner.path != os.path.normpath(path) else None,
                other_owners=tuple(o for o in env.owners_of(path) if o != dist.key),
                without=fallback.path if fallback and fallback.path else "missing",
                without_via=fallback.via if fallback else "missing",
            )
        )
    return explanation


def _newly_missing(now: LibraryReport, without: LibraryReport) -> list[str]:
    before = {(r.requester, r.soname) for r in now.missing()}
    out: dict[str, None] = {}
    for r in without.missing():
        if (r.requester, r.soname) not in before:
            out.setdefault(_describe_miss(r), None)
    return list(out)


def _describe_miss(r: Resolution) -> str:
    when = {"import": "at import", "lazy": "on first use", "extension": "for an extension"}[r.stage]
    return f"{r.soname} (needed by {_short(r.requester)} {when})"
