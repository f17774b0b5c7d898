"""The requirement graph kept in the parse cache: read back, it is the graph a fresh build gives, it parses only
the lines someone reads, and any change to what it was built from builds it again."""

from __future__ import annotations

from typing import Any

from dflash_doctor.env import requirement_graph as rg
from dflash_doctor.env.parse_cache import ParseCache
from dflash_doctor.env.requirement_graph import RequirementGraph, cached_requirement_graph, marker_environment
from tests.conftest import env_for
from tests.fakeenv import FakeSite
from tests.packaging_fixtures import cu13_site


def shape(graph: RequirementGraph) -> tuple[Any, ...]:
    """Everything a check reads of a graph, requirement text included."""
    return (
        [(e.requester, e.target, e.extra, e.line, str(e.requirement)) for e in graph.edges],
        [(p.edge.requester, p.edge.target, p.edge.extra, p.installed) for p in graph.problems],
        {key: sorted(names) for key, names in graph.extras.items()},
    )


def broken_site(site: FakeSite) -> FakeSite:
    """cu13 torch with one component missing and one at the wrong version: a graph with problems."""
    cu13_site(site)
    site.remove_dist("nvidia-cudnn-cu13")
    site.add_dist("user", "1.0", requires=["filelock>=99", 'cuda-toolkit[cublas]; python_version >= "3"'])
    return site


def test_a_graph_read_back_is_the_built_one_and_parses_only_what_is_read(site: FakeSite) -> None:
    broken_site(site)
    cache = ParseCache(None)
    env = env_for(site)
    markers = marker_environment(env.interpreter)
    built = cached_requirement_graph(env.distributions, markers, cache)
    assert cache.misses == 1 and built.problems and any(e.through_extra for e in built.edges)

    fresh = env_for(site)  # a later run: nothing parsed yet
    graph = cached_requirement_graph(fresh.distributions, markers, cache)
    assert cache.hits == 1
    assert not any(d._parsed_requirements for d in fresh.distributions.values())  # no line parsed on reading
    assert graph.closure("torch") == built.closure("torch")  # by target names alone
    assert not any(d._parsed_requirements for d in fresh.distributions.values())
    edge = graph.problems[0].edge
    assert str(edge.requirement) == str(built.problems[0].edge.requirement)
    assert sum(len(d._parsed_requirements) for d in fresh.distributions.values()) == 1  # the one line read
    assert shape(graph) == shape(built)


def test_a_change_to_what_the_graph_is_made_of_builds_it_again(site: FakeSite) -> None:
    broken_site(site)
    cache = ParseCache(None)
    env = env_for(site)
    markers = marker_environment(env.interpreter)
    cached_requirement_graph(env.distributions, markers, cache)

    site.add_dist("nvidia-cudnn-cu13", "9.13.0.50")  # installed since: a version and its requirements
    later = env_for(site)
    graph = cached_requirement_graph(later.distributions, markers, cache)
    assert cache.misses == 2 and shape(graph) == shape(
        rg.build_requirement_graph(later.distributions, markers)
    )

    older_python = {
        **markers,
        "python_version": "2.7",
        "python_full_version": "2.7.18",
    }  # another interpreter
    graph = cached_requirement_graph(later.distributions, older_python, cache)
    assert cache.misses == 3
    assert "cuda-toolkit" not in {
        e.target for e in graph.edges if e.requester == "user"
    }  # its marker fails now


def test_an_entry_that_does_not_fit_is_built_again(site: FakeSite) -> None:
    broken_site(site)
    cache = ParseCache(None)
    env = env_for(site)
    markers = marker_environment(env.interpreter)
    expected = shape(rg.build_requirement_graph(env.distributions, markers))
    digest = rg._inputs_digest(env.distributions, markers)
    for stored in (
        ([("torch", "filelock", 999, "")], [], []),  # a line torch's METADATA does not have
        ([("nobody", "filelock", 0, "")], [], []),  # a requester not installed
        ([("torch", "filelock", 0, "")], [(5, None)], []),  # a problem on an edge that is not there
        "not a graph",
    ):
        cache.tables["derived"][rg.GRAPH_KEY] = (digest, stored)
        assert shape(cached_requirement_graph(env_for(site).distributions, markers, cache)) == expected


def test_without_a_cache_the_graph_is_built() -> None:
    assert cached_requirement_graph({}, {}, None).edges == []
