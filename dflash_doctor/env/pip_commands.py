"""Pip commands a person can paste, aimed at the audited interpreter (not at whatever `pip` is on PATH)."""

from __future__ import annotations

import shlex

from packaging.requirements import Requirement

from dflash_doctor.env.environment import Environment


def pip_command(env: Environment, verb: str, *args: str) -> str:
    """`<python> -m pip <verb> <args>`; `uv pip ... --python <python>` for a pip-less uv environment."""
    python = shlex.quote(env.interpreter.executable)
    tail = " ".join(args)
    if env.get("pip") is None and _installed_by_uv(env):
        return f"uv pip {verb} --python {python} {tail}"
    return f"{python} -m pip {verb} {tail}"


def pinned(name: str, requirement: Requirement | None = None, version: str | None = None) -> str:
    """What to install: the exact pin a dependent asks for, else its specifier, else the version given."""
    if requirement is not None and requirement.specifier:
        specs = list(requirement.specifier)
        if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
            return f"{name}=={specs[0].version}"
        return shlex.quote(f"{name}{requirement.specifier}")
    return f"{name}=={version}" if version else name


def _installed_by_uv(env: Environment) -> bool:
    torch = env.torch_dist
    return torch is not None and (torch.installer or "").startswith("uv")
