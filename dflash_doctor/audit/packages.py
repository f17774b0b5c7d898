"""The package-level analyses several checks share, computed once per run through `ctx.shared`.

`packages.*` and `ownership.*` both need the requirement graph (who needs what, with which pin) and
the RECORD audit (who claims which file, what is gone or changed); this module is the one place that
builds them, so a `check` run reads every RECORD and hashes every file at most once.
"""

from __future__ import annotations

import os

from dflash_doctor.context import CheckContext
from dflash_doctor.env.cuda_family import (
    TOOLKIT_NAME,
    CudaFamily,
    cuda_family,
    is_cuda_flavoured,
    toolkit_pins,
)
from dflash_doctor.env.distributions import Distribution
from dflash_doctor.env.file_hashes import HashCache
from dflash_doctor.env.pip_commands import pinned, reinstall_command, uninstall_command
from dflash_doctor.env.record_audit import (
    RecordAudit,
    audit_records,
    is_preloaded_cuda_library,
    start_record_survey,
)
from dflash_doctor.env.requirement_graph import RequirementGraph, cached_requirement_graph, marker_environment
from dflash_doctor.libs.loader import library_report


def requirement_graph(ctx: CheckContext) -> RequirementGraph:
    env = ctx.env
    return ctx.shared(
        "packages.requirement_graph",
        lambda: cached_requirement_graph(
            env.distributions, marker_environment(env.interpreter), env.parse_cache
        ),
    )


def torch_closure(ctx: CheckContext) -> set[str]:
    """torch and everything it needs (through extras), by distribution key; empty without torch."""
    if ctx.env.torch_dist is None:
        return set()
    return requirement_graph(ctx).closure("torch")


def cuda_families(ctx: CheckContext) -> dict[str, CudaFamily]:
    """Distribution key -> its CUDA family, for every distribution that has one."""

    def build() -> dict[str, CudaFamily]:
        pins: dict[str, int] = {}
        toolkit = ctx.env.get(TOOLKIT_NAME)
        if toolkit is not None:
            pins = toolkit_pins(toolkit.version, toolkit.requires)
        found = {}
        for key, dist in ctx.env.distributions.items():
            paths = _relative_paths(dist) if is_cuda_flavoured(dist.name) else []
            family = cuda_family(dist.name, dist.version, paths, pins)
            if family is not None:
                found[key] = family
        return found

    return ctx.shared("packages.cuda_families", build)


SURVEY = "ownership.survey"


def start_ownership_survey(ctx: CheckContext) -> None:
    """The `ownership.*` checks' starter: the stat of every RECORD file begins before any check runs."""
    ctx.start(SURVEY, lambda: start_record_survey(ctx.env.distributions))


def record_audit(ctx: CheckContext) -> RecordAudit:
    """The RECORD audit, with its hash cache saved afterwards."""

    def build() -> RecordAudit:
        cache = HashCache.load()
        hash_paths = libraries_worth_hashing(ctx)
        env = ctx.env
        audit = audit_records(
            env.distributions, cache, hash_paths, started=ctx.started(SURVEY), parse_cache=env.parse_cache
        )
        cache.save()
        return audit

    return ctx.shared("ownership.record_audit", build)


def libraries_worth_hashing(ctx: CheckContext) -> set[str]:
    """What torch preloads from `nvidia/*/lib`, plus whatever the library report says the loader resolves."""
    closure = torch_closure(ctx)
    library_paths = ctx.env.library_paths  # the `.so` rows: every preloaded library's among them
    preloaded = {
        path for key in closure for path in library_paths.get(key, ()) if is_preloaded_cuda_library(path)
    }
    return preloaded | resolved_library_paths(ctx)


def resolved_library_paths(ctx: CheckContext) -> set[str]:
    """Where the loader simulation resolves each soname torch needs (`libs.loader.library_report`).

    It belongs to the library-resolution checks; we only read it and never fail because of it.
    """
    try:
        return {os.path.normpath(path) for path in library_report(ctx).loaded_paths.values()}
    except Exception:  # their bug must not take our check down; we fall back to the preload list
        return set()


def _relative_paths(dist: Distribution) -> list[str]:
    prefix = dist.site_dir.rstrip(os.sep) + os.sep
    cut = len(prefix)
    return [path[cut:] if path.startswith(prefix) else path for path, _, _ in dist.record_rows]


def wanted_pin(ctx: CheckContext, key: str) -> str:
    """`nvidia-nccl-cu13==2.30.7`: the version torch's tree pins (else another dependent's pin), kept at
    the installed version when that satisfies the pin; else the installed one."""
    graph, closure = requirement_graph(ctx), torch_closure(ctx)
    dist = ctx.env.get(key)
    name = dist.name if dist is not None else key
    requesters = graph.required_by(key)
    for requester in [*sorted(requesters & closure), *sorted(requesters - closure)]:
        requirement = graph.requirement_on(requester, key)
        if requirement is not None and requirement.specifier:
            return pinned(name, requirement, dist.version if dist else None)
    return pinned(name, None, dist.version if dist else None)


def removable(ctx: CheckContext, keys: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """Which of `keys` an uninstall may take: none that an installed distribution staying behind requires.

    Returns (removable keys, kept key -> who requires it). A remedy that uninstalls what torch or another
    package requires trades one finding for a broken import (a healthy cu12 tree lost 10 of torch's
    CUDA packages that way).
    """
    graph = requirement_graph(ctx)
    leaving = set(keys)
    kept: dict[str, list[str]] = {}
    changed = True
    while changed:
        changed = False
        for key in sorted(leaving):
            staying = sorted(r for r in graph.required_by(key) if r not in leaving)
            if staying:
                leaving.discard(key)
                kept[key] = staying
                changed = True
    return [k for k in keys if k in leaving], kept


def twin_remedy(ctx: CheckContext, strays: list[str], wanted: list[str]) -> str | None:
    """`pip uninstall -y <strays> && pip install --force-reinstall --no-deps <wanted>==<pin torch needs>`.

    Only strays nothing installed requires are uninstalled (`removable`); `--force-reinstall` because
    pip otherwise answers "already installed" while the files are gone, `--no-deps` so the reinstall
    moves nothing else off its pin.
    """
    env = ctx.env
    gone, _ = removable(ctx, strays)
    names = [env.distributions[k].name if k in env.distributions else k for k in gone]
    reinstall = reinstall_command(env, *[wanted_pin(ctx, k) for k in wanted]) if wanted else None
    if not names:
        return reinstall
    uninstall = uninstall_command(env, *names)
    return f"{uninstall} && {reinstall}" if reinstall else uninstall
