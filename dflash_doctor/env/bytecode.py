"""Whether a package's modules have cached bytecode for an interpreter, read from files only.

A module without a matching `.pyc` is compiled from source by every interpreter that imports it, and
torchrun starts one per GPU. Where the `.pyc` lives is importlib's `cache_from_source`, redone here for
the *audited* interpreter's cache tag and settings (that function only knows the running one):
`<dir>/__pycache__/<stem>.<tag>[.opt-N].pyc`, or `<prefix>/<dir without its leading slash>/<stem>...`
while `PYTHONPYCACHEPREFIX` is set (then the `__pycache__` beside the sources is never read).

One sample costs a `listdir` per folder and no `stat` per file: the package folder and its direct
sub-packages, capped, which is what `import <package>` loads first.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dflash_doctor.env.interpreter import InterpreterInfo

MAX_SUBPACKAGES = 80  # torch has ~60 direct sub-packages, sympy ~40, transformers ~12
MAX_MODULES = 1000  # per package; torch's top two levels hold ~700 modules


@dataclass(frozen=True)
class BytecodeSettings:
    """What decides which `.pyc` an import reads and whether it may write one."""

    cache_tag: str
    pycache_prefix: str | None = None  # PYTHONPYCACHEPREFIX, made absolute
    optimization: int = 0  # PYTHONOPTIMIZE: level N reads `<stem>.<tag>.opt-N.pyc`
    dont_write: str | None = None  # why nothing gets written (PYTHONDONTWRITEBYTECODE, site customisation)


def cache_tag_of(interpreter: InterpreterInfo) -> str | None:
    """The audited interpreter's `sys.implementation.cache_tag`; for CPython `cpython-XY` when not probed."""
    if interpreter.cache_tag:
        return interpreter.cache_tag
    if interpreter.implementation != "cpython":
        return None
    major, minor = interpreter.version.split(".")[:2]
    return f"cpython-{major}{minor}"


def optimization_level(value: str | None) -> int:
    """CPython's reading of PYTHONOPTIMIZE: unset or empty 0, a non-negative integer itself, anything else 1."""
    if not value:
        return 0
    try:
        level = int(value)
    except ValueError:
        return 1
    return level if level >= 0 else 1


def settings_for(interpreter: InterpreterInfo, environ: Mapping[str, str]) -> BytecodeSettings | None:
    """The settings the audited interpreter's processes run with; None when its cache tag is unknown.

    `environ` is this process's: a `--python` interpreter runs as our child and inherits it, and so
    does a launch started from this shell.
    """
    tag = cache_tag_of(interpreter)
    if tag is None:
        return None
    prefix = environ.get("PYTHONPYCACHEPREFIX") or None
    dont_write = None
    if environ.get("PYTHONDONTWRITEBYTECODE"):
        dont_write = f"PYTHONDONTWRITEBYTECODE={environ['PYTHONDONTWRITEBYTECODE']} is set"
    elif interpreter.site_disables_bytecode:
        dont_write = "the interpreter's start-up (sitecustomize, usercustomize or a .pth file) sets sys.dont_write_bytecode"
    return BytecodeSettings(
        cache_tag=tag,
        pycache_prefix=os.path.abspath(prefix) if prefix else None,
        optimization=optimization_level(environ.get("PYTHONOPTIMIZE")),
        dont_write=dont_write,
    )


def bytecode_dir(source_dir: str, pycache_prefix: str | None) -> str:
    """The folder holding the `.pyc` of the modules in `source_dir`."""
    if pycache_prefix:
        return os.path.join(pycache_prefix, os.path.abspath(source_dir).lstrip(os.sep))
    return os.path.join(source_dir, "__pycache__")


def bytecode_name(module_file: str, settings: BytecodeSettings) -> str:
    """`mod.py` -> `mod.cpython-312.pyc` (`mod.cpython-312.opt-1.pyc` under PYTHONOPTIMIZE=1)."""
    stem = module_file.rpartition(".")[0]
    level = f".opt-{settings.optimization}" if settings.optimization else ""
    return f"{stem}.{settings.cache_tag}{level}.pyc"


def bytecode_path(source: str, settings: BytecodeSettings) -> str:
    """Where the audited interpreter looks for the bytecode of `source` (a `.py` file)."""
    folder, name = os.path.split(source)
    return os.path.join(bytecode_dir(folder, settings.pycache_prefix), bytecode_name(name, settings))


def can_write(folder: str) -> bool:
    """Could this user write a `.pyc` into `folder`, creating it (and missing parents) if need be?"""
    probe = folder
    while not os.path.isdir(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return False
        probe = parent
    return os.access(probe, os.W_OK | os.X_OK)


@dataclass(frozen=True)
class PackageBytecode:
    """The sampled modules of one package and which of them an import would compile from source."""

    name: str
    folder: str
    sampled: int
    missing: tuple[str, ...]  # sources with no bytecode where the audited interpreter looks
    beside_sources: int  # of those, how many have one in the plain `__pycache__` (ignored under a prefix)
    unwritable: tuple[str, ...]  # bytecode folders of missing modules this user cannot write
    other_tags: tuple[str, ...]  # other interpreters' cache tags found in the sampled `__pycache__` folders

    @property
    def missing_share(self) -> float:
        return len(self.missing) / self.sampled if self.sampled else 0.0

    def describe(self) -> str:
        if not self.missing:
            return f"all {self.sampled} sampled modules have cached bytecode"
        return f"{len(self.missing)} of {self.sampled} sampled modules have no cached bytecode"


def _listing(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _source_folders(package_dir: str) -> list[tuple[str, list[str]]]:
    """(folder, its .py files) for the package folder and its first MAX_SUBPACKAGES sub-packages."""
    found: list[tuple[str, list[str]]] = []
    try:
        entries = sorted(os.scandir(package_dir), key=lambda e: e.name)
    except OSError:
        return found
    top = sorted((e.name for e in entries if e.name.endswith(".py")), key=lambda n: (n != "__init__.py", n))
    found.append((package_dir, top))  # `__init__.py` first: the module `import <package>` surely runs
    subpackages = 0
    for entry in entries:
        if subpackages >= MAX_SUBPACKAGES:
            break
        if entry.name.startswith((".", "__pycache__")) or not entry.is_dir():
            continue
        names = _listing(entry.path)
        if "__init__.py" in names:  # a folder without one (include/, lib/) is no package
            found.append((entry.path, sorted(n for n in names if n.endswith(".py"))))
            subpackages += 1
    return found


def sample_package(
    name: str,
    package_dir: str,
    settings: BytecodeSettings,
    writable: Callable[[str], bool] = can_write,
) -> PackageBytecode:
    """Which sampled modules of `package_dir` would be compiled from source, and whether that sticks."""
    sampled = 0
    missing: list[str] = []
    beside = 0
    unwritable: list[str] = []
    other_tags: set[str] = set()
    for folder, modules in _source_folders(package_dir):
        modules = modules[: MAX_MODULES - sampled]
        if not modules:
            continue
        sampled += len(modules)
        plain = set(_listing(os.path.join(folder, "__pycache__")))
        cached_dir = bytecode_dir(folder, settings.pycache_prefix)
        cached = plain if settings.pycache_prefix is None else set(_listing(cached_dir))
        other_tags.update(_tags_in(plain) - {settings.cache_tag})
        gone = [m for m in modules if bytecode_name(m, settings) not in cached]
        if not gone:
            continue
        missing += [os.path.join(folder, m) for m in gone]
        if settings.pycache_prefix is not None:
            beside += sum(bytecode_name(m, settings) in plain for m in gone)
        if not writable(cached_dir):
            unwritable.append(cached_dir)
    return PackageBytecode(
        name, package_dir, sampled, tuple(missing), beside, tuple(unwritable), tuple(sorted(other_tags))
    )


def _tags_in(names: set[str]) -> set[str]:
    """`os.cpython-311.pyc` -> `cpython-311` (an `.opt-N` part is not part of the tag)."""
    tags = set()
    for name in names:
        parts = name.split(".")
        if len(parts) >= 3 and parts[-1] == "pyc":
            tags.add(parts[-3] if parts[-2].startswith("opt-") and len(parts) >= 4 else parts[-2])
    return tags
