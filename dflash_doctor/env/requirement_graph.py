"""Every installed distribution's requirements, followed through extras, for the audited interpreter.

`pip check` evaluates `Requires-Dist` for the base distribution only: torch's
`cuda-toolkit[cublas,cudart,...]==13.0.3` is "satisfied" by cuda-toolkit alone, and the
`nvidia-cublas==13.1.1.3.*; extra == "cublas"` lines that actually pull in the libraries are never
looked at. We walk the graph with the requested extras, so a missing component is named.
"""

from __future__ import annotations

import os
import platform
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from packaging.markers import InvalidMarker, Marker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from dflash_doctor.env.distributions import Distribution
from dflash_doctor.env.interpreter import InterpreterInfo


def marker_environment(interpreter: InterpreterInfo) -> dict[str, str]:
    """PEP 508 marker values for the audited interpreter, from what we already know about it.

    The platform fields come from this host: `--python` audits an interpreter on the same machine.
    """
    parts = [*interpreter.version.split("."), "0", "0"][:3]
    uname = os.uname()
    cpython = interpreter.implementation == "cpython"
    return {
        "python_version": ".".join(parts[:2]),
        "python_full_version": interpreter.version,
        "implementation_name": interpreter.implementation,
        "implementation_version": interpreter.version if cpython else "0",
        "platform_python_implementation": "CPython" if cpython else interpreter.implementation.capitalize(),
        "platform_machine": interpreter.machine or uname.machine,
        "platform_system": platform.system(),
        "platform_release": uname.release,
        "platform_version": uname.version,
        "sys_platform": "linux" if platform.system() == "Linux" else platform.system().lower(),
        "os_name": os.name,
        "extra": "",
    }


def marker_applies(marker: Marker | None, env: Mapping[str, str], extras: Iterable[str] = ()) -> bool:
    """True when the marker holds for the base install or for any of the requested extras."""
    if marker is None:
        return True
    return any(_holds(marker, env, extra) for extra in ("", *extras))


def _holds(marker: Marker, env: Mapping[str, str], extra: str) -> bool:
    """One evaluation, with `extra` set; a marker that cannot be evaluated does not hold."""
    try:
        return bool(marker.evaluate({**env, "extra": extra}))
    except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
        return False


@dataclass(frozen=True)
class Edge:
    """`requester` needs `requirement` (active for the extras requested of the requester)."""

    requester: str
    requirement: Requirement
    extra: str = ""  # the requester's extra that activates it; "" for a base requirement

    @property
    def through_extra(self) -> bool:
        """Active only because an extra was asked for: `pip check` never evaluates these."""
        return self.extra != ""

    @property
    def requested_as(self) -> str:
        """`cuda-toolkit[cublas]` or `torch`: who asks, as a person would write it."""
        return f"{self.requester}[{self.extra}]" if self.extra else self.requester

    @property
    def target(self) -> str:
        return canonicalize_name(self.requirement.name)


@dataclass(frozen=True)
class Problem:
    """An edge that the installed distributions do not satisfy."""

    edge: Edge
    installed: str | None  # the version found, None when the distribution is missing

    @property
    def kind(self) -> str:
        return "missing" if self.installed is None else "wrong_version"


@dataclass
class RequirementGraph:
    """Active requirement edges and the extras each distribution was asked for."""

    edges: list[Edge] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    extras: dict[str, set[str]] = field(default_factory=dict)

    def closure(self, *roots: str) -> set[str]:
        """The roots and everything they need, transitively (installed or not)."""
        by_requester: dict[str, list[str]] = {}
        for edge in self.edges:
            by_requester.setdefault(edge.requester, []).append(edge.target)
        seen: set[str] = {canonicalize_name(r) for r in roots}
        todo = list(seen)
        while todo:
            for target in by_requester.get(todo.pop(), []):
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        return seen

    def required_by(self, name: str) -> set[str]:
        """Who asks for `name` directly."""
        key = canonicalize_name(name)
        return {e.requester for e in self.edges if e.target == key}

    def requirement_on(self, requester: str, name: str) -> Requirement | None:
        key, who = canonicalize_name(name), canonicalize_name(requester)
        return next((e.requirement for e in self.edges if e.requester == who and e.target == key), None)


def version_satisfies(version: str, requirement: Requirement) -> bool:
    """`2.13.0+cpu` satisfies `torch==2.13.0`; pre-releases count (the user installed them)."""
    if not requirement.specifier:
        return True
    try:
        return requirement.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def build_requirement_graph(
    distributions: Mapping[str, Distribution], env: Mapping[str, str]
) -> RequirementGraph:
    """Walk every distribution's requirements, then the extras its dependents ask of it."""
    graph = RequirementGraph(extras={key: set() for key in distributions})
    done: set[tuple[str, str]] = set()  # (distribution, extra) already expanded; "" is the base
    todo: deque[tuple[str, str]] = deque((key, "") for key in distributions)
    # Whether each requirement holds with no extra: asked once per requirement, not once per extra
    # expanded (cuda-toolkit's ~60 lines are looked at again for each of torch's ~10 extras).
    in_base: dict[int, bool] = {}
    while todo:
        key, extra = todo.popleft()
        if (key, extra) in done or key not in distributions:
            continue
        done.add((key, extra))
        dist = distributions[key]
        for req in dist.requirements if extra else dist.requirements_maybe_in_base():
            base = in_base.get(id(req))
            if base is None:
                base = in_base[id(req)] = marker_applies(req.marker, env)
            if not _active_for(req.marker, env, extra, base):
                continue
            edge = Edge(key, req, extra)
            graph.edges.append(edge)
            found = distributions.get(edge.target)
            if found is None:
                graph.problems.append(Problem(edge, None))
                continue
            if not version_satisfies(found.version, req):
                graph.problems.append(Problem(edge, found.version))
            for wanted in req.extras:
                wanted_key = canonicalize_name(wanted)
                graph.extras[edge.target].add(wanted_key)
                todo.append((edge.target, wanted_key))
    return graph


def _active_for(marker: Marker | None, env: Mapping[str, str], extra: str, in_base: bool) -> bool:
    """Expanding the base: markers that hold with no extra. Expanding an extra: only its own lines,
    those that do not hold for the base install (the kind `pip check` never evaluates) but hold with
    this extra. `in_base` is `marker_applies(marker, env)`, evaluated once per requirement.
    """
    if extra == "":
        return in_base
    return marker is not None and not in_base and _holds(marker, env, extra)
