"""startup.*: what every fresh training process pays before its first step.

Measured on the H200 machine (python 3.12, torch 2.11.0+cu130): no `.pyc` was written or read, so each
interpreter compiled its imports from source (1,793 modules through `source_to_code`, 5.7 s in
`compile` for one `train --dry-run`); `import torch` took 3.7-5.1 s, `from transformers import
Qwen3Config` 12.9-14.4 s, a worker's `import trainer.run.train` 12.4-14.1 s, and torchrun starts one
interpreter per GPU plus its launcher. Static: nothing is imported, one `listdir` per sampled folder.

Environment: the variables of *this* process (PYTHONDONTWRITEBYTECODE, PYTHONPYCACHEPREFIX,
PYTHONOPTIMIZE). With `--python` the audited interpreter runs as our child and inherits them, as a
launch from this shell does (the reasoning of checks/hazards.py).
"""

from __future__ import annotations

import os
import pwd
import shlex
from collections.abc import Iterator
from typing import NamedTuple

from dflash_doctor.context import CheckContext
from dflash_doctor.env import bytecode
from dflash_doctor.env.bytecode import BytecodeSettings, PackageBytecode, sample_package, settings_for
from dflash_doctor.env.environment import Environment
from dflash_doctor.env.torch_build import TRITON_NAMES
from dflash_doctor.findings import Finding, ok, skip, warn
from dflash_doctor.registry import check

# Import name -> the distributions that install it: what a training process imports at start-up.
HEAVY_PACKAGES: dict[str, frozenset[str]] = {
    "torch": frozenset({"torch"}),
    "transformers": frozenset({"transformers"}),
    "triton": TRITON_NAMES,
    "sympy": frozenset({"sympy"}),
}
# Uncached: most sampled modules have no bytecode. A package that was never compiled misses nearly all; one
# whose bytecode was written on import misses only the modules nobody imported (torch: ~40% after `import torch`).
UNCACHED_SHARE = 0.5
COST = (
    "each process compiles them from source at every start, and torchrun starts one per GPU plus its launcher"
)
UV_NOTE = "uv installs no bytecode unless given --compile-bytecode (or UV_COMPILE_BYTECODE=1)"


class HeavyPackage(NamedTuple):
    name: str
    folder: str
    installer: str | None


def heavy_packages(env: Environment) -> list[HeavyPackage]:
    """The heavy packages installed, each with the folder `import <name>` would load."""
    found: list[HeavyPackage] = []
    for name, dist_names in HEAVY_PACKAGES.items():
        if name == "torch":
            if env.torch_dir:
                dist = env.torch_dist
                found.append(HeavyPackage(name, env.torch_dir, dist.installer if dist else None))
            continue
        for dist_name in sorted(dist_names):
            dist = env.get(dist_name)
            if dist is None:
                continue
            folder = os.path.join(dist.site_dir, name)
            if os.path.isfile(os.path.join(folder, "__init__.py")):
                found.append(HeavyPackage(name, folder, dist.installer))
                break
    return found


@check("startup.bytecode", "cached bytecode of the packages every process imports")
def bytecode_check(ctx: CheckContext) -> Iterator[Finding]:
    env = ctx.env
    python = env.interpreter.executable
    packages = heavy_packages(env)
    if not packages or packages[0].name != "torch":
        yield skip("startup.bytecode", f"torch is not installed for {python}: no start-up to look at")
        return
    settings = settings_for(env.interpreter, os.environ)
    if settings is None:
        yield skip(
            "startup.bytecode",
            f"the bytecode file names of a {env.interpreter.implementation} interpreter are not known here",
            interpreter=python,
        )
        return
    samples = [sample_package(p.name, p.folder, settings, writable=bytecode.can_write) for p in packages]
    installers = {p.name: p.installer for p in packages if p.installer}
    yield bytecode_verdict(python, settings, samples, installers)


def bytecode_verdict(
    python: str,
    settings: BytecodeSettings,
    samples: list[PackageBytecode],
    installers: dict[str, str] | None = None,
) -> Finding:
    """ok when the bytecode is there or the first import will write it; warn when every start recompiles."""
    facts: dict[str, object] = {
        "interpreter": python,
        "cache_tag": settings.cache_tag,
        "packages": {s.name: s.describe() for s in samples},
        "folders": {s.name: s.folder for s in samples},
    }
    if settings.pycache_prefix:
        facts["pycache_prefix"] = (
            f"PYTHONPYCACHEPREFIX={settings.pycache_prefix}: .pyc files are read and written only there"
        )
    if settings.optimization:
        facts["optimization"] = f"PYTHONOPTIMIZE: imports read *.opt-{settings.optimization}.pyc"
    if any(s.other_tags for s in samples):
        facts["other_tags"] = {s.name: list(s.other_tags) for s in samples if s.other_tags}
    uncached = [s for s in samples if s.missing_share > UNCACHED_SHARE]
    if not uncached:
        return ok("startup.bytecode", f"bytecode cached for {', '.join(s.name for s in samples)}", **facts)
    counts = ", ".join(f"{s.name} ({len(s.missing)} of {s.sampled} sampled modules)" for s in uncached)
    facts["looked_for"] = {s.name: bytecode.bytecode_path(s.missing[0], settings) for s in uncached}
    installed_by = {s.name: (installers or {}).get(s.name) for s in uncached}
    if any(i for i in installed_by.values()):
        facts["installed_by"] = {
            name: f"{who} ({UV_NOTE})" if who.startswith("uv") else who
            for name, who in installed_by.items()
            if who
        }
    causes = {s.name: causes_of(s, settings) for s in uncached}
    blocked = [s for s in uncached if causes[s.name]]
    if not blocked:
        return ok(
            "startup.bytecode",
            f"no bytecode cached yet for {counts}: nothing stops writing it, so the first import "
            "writes it and later starts read it",
            **facts,
        )
    facts["causes"] = {name: found for name, found in causes.items() if found}
    short = sorted({cause.split(":")[0] for found in causes.values() for cause in found})
    return warn(
        "startup.bytecode",
        f"no cached bytecode for {counts}, and none gets written ({'; '.join(short)}): {COST}",
        remedy=compile_remedy(python, settings, blocked),
        **facts,
    )


def causes_of(sample: PackageBytecode, settings: BytecodeSettings) -> list[str]:
    """Why the missing bytecode of this package is never written (empty: the first import writes it)."""
    found = []
    if settings.dont_write:
        found.append(f"{settings.dont_write}: Python reads .pyc files but writes none")
    if sample.unwritable:
        first = _existing(sample.unwritable[0])
        more = f" and {len(sample.unwritable) - 1} more folders" if len(sample.unwritable) > 1 else ""
        if read_only_filesystem(first):
            found.append(f"a read-only filesystem: {first}{more}")
        else:
            user, owner = _user_name(os.geteuid()), _owner_of(first)
            found.append(f"folders not writable by {user}: {first} (owned by {owner}){more}")
    if found and settings.pycache_prefix and sample.beside_sources:
        found.append(
            f"PYTHONPYCACHEPREFIX hides the bytecode beside the sources: {sample.beside_sources} of the "
            "missing modules have a .pyc in their __pycache__, which Python ignores while it is set"
        )
    return found


def compile_remedy(python: str, settings: BytecodeSettings, blocked: list[PackageBytecode]) -> str:
    """compileall with the audited interpreter, into the folders its imports read, as whoever can write them."""
    prefix = f"PYTHONPYCACHEPREFIX={shlex.quote(settings.pycache_prefix)} " if settings.pycache_prefix else ""
    level = f" -o {settings.optimization}" if settings.optimization else ""
    folders = " ".join(shlex.quote(s.folder) for s in blocked)
    command = f"{prefix}{shlex.quote(python)} -m compileall -q -j 0{level} {folders}"
    unwritable = [d for s in blocked for d in s.unwritable]
    notes = []
    if unwritable and read_only_filesystem(unwritable[0]):
        notes.append(
            f"{_existing(unwritable[0])} is on a read-only filesystem: run it where the environment is built, "
            "or with PYTHONPYCACHEPREFIX set (here and for training) to a persistent folder you own"
        )
    elif unwritable:
        notes.append(f"as {_owner_of(unwritable[0])}, who can write {_existing(unwritable[0])}")
    if settings.dont_write:
        notes.append("the .pyc files are read even while PYTHONDONTWRITEBYTECODE is set")
        if not unwritable and settings.dont_write.startswith("PYTHONDONTWRITEBYTECODE"):
            notes.append("or `unset PYTHONDONTWRITEBYTECODE` so the first import writes them")
    if settings.pycache_prefix and all(s.beside_sources * 2 >= len(s.missing) for s in blocked):
        notes.append("or `unset PYTHONPYCACHEPREFIX`: the bytecode beside the sources is there")
    return f"{command}  # {'; '.join(notes)}" if notes else command


def read_only_filesystem(folder: str) -> bool:
    """Mounted read-only: nobody can write there, not even its owner or root."""
    try:
        return bool(os.statvfs(_existing(folder)).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _existing(folder: str) -> str:
    """The folder itself, or its nearest existing parent (a bytecode folder may not exist yet)."""
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    return folder


def _owner_of(folder: str) -> str:
    try:
        return _user_name(os.stat(_existing(folder)).st_uid)
    except OSError:
        return "its owner"


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
