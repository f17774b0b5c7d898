"""Every installed distribution's requirements, followed through extras, for the audited interpreter.

`pip check` evaluates `Requires-Dist` for the base distribution only: torch's
`cuda-toolkit[cublas,cudart,...]==13.0.3` is "satisfied" by cuda-toolkit alone, and the
`nvidia-cublas==13.1.1.3.*; extra == "cublas"` lines that actually pull in the libraries are never
looked at. We walk the graph with the requested extras, so a missing component is named.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import platform
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from packaging.markers import InvalidMarker, Marker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from dflash_doctor.env.distributions import Distribution
from dflash_doctor.env.interpreter import InterpreterInfo

if TYPE_CHECKING:
    from dflash_doctor.env.parse_cache import ParseCache

# The parse cache's entry for this environment's graph (table "derived"). Bump GRAPH_FORMAT when
# build_requirement_graph answers differently for the same distributions and markers.
GRAPH_KEY = "requirement-graph"
GRAPH_FORMAT = 1


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
    """`requester` needs `target` (active for the extras requested of the requester): line `line` of the
    requester's Requires-Dist, parsed only when someone reads `requirement` (a graph read back from the
    parse cache parses ~30 of its ~800 lines)."""

    requester: str
    target: str  # the required distribution's key (canonical name)
    source: Distribution = field(compare=False, repr=False)  # the requester's distribution
    line: int = field(compare=False)
    extra: str = ""  # the requester's extra that activates it; "" for a base requirement

    @property
    def requirement(self) -> Requirement:
        return self.source.requirement_line(self.line)

    @property
    def through_extra(self) -> bool:
        """Active only because an extra was asked for: `pip check` never evaluates these."""
        return self.extra != ""

    @property
    def requested_as(self) -> str:
        """`cuda-toolkit[cublas]` or `torch`: who asks, as a person would write it."""
        return f"{self.requester}[{self.extra}]" if self.extra else self.requester


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
        for line, req in dist.numbered_requirements(maybe_in_base=not extra):
            base = in_base.get(id(req))
            if base is None:
                base = in_base[id(req)] = marker_applies(req.marker, env)
            if not _active_for(req.marker, env, extra, base):
                continue
            edge = Edge(key, canonicalize_name(req.name), dist, line, extra)
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


def cached_requirement_graph(
    distributions: Mapping[str, Distribution], env: Mapping[str, str], cache: ParseCache | None
) -> RequirementGraph:
    """`build_requirement_graph`, read back from the parse cache while every distribution's name, version and
    Requires-Dist lines and the marker environment are what they were: a warm `check` of a CUDA environment
    then parses ~30 requirement lines instead of ~800 and evaluates no marker (~20 ms of packaging on a
    2-core box). The entry's stamp is a digest of those inputs, not of files, so it cannot be racy."""
    if cache is None:
        return build_requirement_graph(distributions, env)
    built: list[RequirementGraph] = []

    def build() -> tuple[Any, ...]:
        built.append(build_requirement_graph(distributions, env))
        return _compact(built[0])

    stored = cache.get("derived", GRAPH_KEY, _inputs_digest(distributions, env), build)
    if built:
        return built[0]
    graph = _expand(stored, distributions)
    return graph if graph is not None else build_requirement_graph(distributions, env)


def _inputs_digest(distributions: Mapping[str, Distribution], env: Mapping[str, str]) -> str:
    """Everything the graph is made from, in scan order (which orders the edges)."""
    inputs = [(key, dist.version, list(dist.requires)) for key, dist in distributions.items()]
    return hashlib.sha256(marshal.dumps((GRAPH_FORMAT, inputs, sorted(env.items())))).hexdigest()


def _compact(graph: RequirementGraph) -> tuple[Any, ...]:
    """The graph as plain tuples: edges by requester, target, line and extra; problems by edge number."""
    number = {id(edge): index for index, edge in enumerate(graph.edges)}
    return (
        [(e.requester, e.target, e.line, e.extra) for e in graph.edges],
        [(number[id(p.edge)], p.installed) for p in graph.problems],
        [(key, sorted(extras)) for key, extras in graph.extras.items()],
    )


def _expand(stored: Any, distributions: Mapping[str, Distribution]) -> RequirementGraph | None:
    """`_compact`'s graph again, over these distributions; None when it does not fit them (then rebuilt)."""
    try:
        edges_in, problems_in, extras_in = stored
        edges = []
        for requester, target, line, extra in edges_in:
            source = distributions[requester]
            if not 0 <= line < len(source.requires):
                return None
            edges.append(Edge(requester, target, source, line, extra))
        problems = [Problem(edges[index], installed) for index, installed in problems_in]
        extras = {key: set(names) for key, names in extras_in}
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return RequirementGraph(edges, problems, extras)


def _active_for(marker: Marker | None, env: Mapping[str, str], extra: str, in_base: bool) -> bool:
    """Expanding the base: markers that hold with no extra. Expanding an extra: only its own lines,
    those that do not hold for the base install (the kind `pip check` never evaluates) but hold with
    this extra. `in_base` is `marker_applies(marker, env)`, evaluated once per requirement.
    """
    if extra == "":
        return in_base
    return marker is not None and not in_base and _holds(marker, env, extra)
