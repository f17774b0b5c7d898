"""Pip commands a person can paste, aimed at the audited interpreter (not at whatever `pip` is on PATH).

A remedy is a promise: run as printed, without a terminal, it must leave torch working. So every
reinstall is `--force-reinstall --no-deps` (a plain `--force-reinstall` also upgrades the package's own
requirements past the pins torch holds them at), and every uninstall says `-y` (without a terminal
`pip uninstall` stops at its prompt and the `&&` chain stops with it).
"""

from __future__ import annotations

import shlex

from packaging.requirements import Requirement
from packaging.version import InvalidVersion

from dflash_doctor.env.environment import Environment


def pip_command(env: Environment, verb: str, *args: str) -> str:
    """`<python> -m pip <verb> <args>`; `uv pip ... --python <python>` for a pip-less uv environment."""
    python = shlex.quote(env.interpreter.executable)
    tail = " ".join(args)
    if _uses_uv(env):
        return f"uv pip {verb} --python {python} {tail}"
    return f"{python} -m pip {verb} {tail}"


def reinstall_command(env: Environment, *specs: str) -> str:
    """Put back exactly these pinned distributions' files and nothing else (`--no-deps`)."""
    return pip_command(env, "install", "--force-reinstall", "--no-deps", *specs)


def uninstall_command(env: Environment, *names: str) -> str:
    """Uninstall without a prompt (`uv pip uninstall` never asks, and has no `-y`)."""
    return (
        pip_command(env, "uninstall", *names)
        if _uses_uv(env)
        else pip_command(env, "uninstall", "-y", *names)
    )


def install_command(env: Environment, *specs: str) -> str:
    """Install what is missing (its own missing requirements come along; satisfied ones stay put)."""
    return pip_command(env, "install", *specs)


def pinned(name: str, requirement: Requirement | None = None, version: str | None = None) -> str:
    """What to install: the exact pin a dependent asks for, else its specifier, else the version given."""
    if requirement is not None and requirement.specifier:
        specs = list(requirement.specifier)
        if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
            return f"{name}=={specs[0].version}"
        if version is not None and _satisfies(version, requirement):
            return f"{name}=={version}"  # what is installed satisfies the range: keep exactly it
        return shlex.quote(f"{name}{requirement.specifier}")
    return f"{name}=={version}" if version else name


def _satisfies(version: str, requirement: Requirement) -> bool:
    try:
        return requirement.specifier.contains(version, prereleases=True)
    except InvalidVersion:
        return False


def _uses_uv(env: Environment) -> bool:
    return env.get("pip") is None and _installed_by_uv(env)


def _installed_by_uv(env: Environment) -> bool:
    torch = env.torch_dist
    return torch is not None and (torch.installer or "").startswith("uv")
