"""Every rank of a run runs the same topology and graph config: `check_agreement` over the ranks' digests
(what `trainer.run.train.main` all_gathers right after the process group forms) is quiet when they agree and
names what each node runs, and the fix, when they do not."""

from __future__ import annotations

import pytest

from dflash_base.errors import ConfigError
from trainer.runspec.config import load_config
from trainer.runspec.topology import RunDigest, Topology, check_agreement, graph_config_hash, resolve_topology

SHORT = ["optim.steps=4"]


def digests(per_node: list[tuple[Topology, list[str]]], ranks_per_node: int = 1) -> list[RunDigest]:
    """The digests of every rank: node n runs topology and overrides per_node[n]."""
    out = []
    for node, (topology, overrides) in enumerate(per_node):
        cfg = load_config("tiny-cpu", [*SHORT, *overrides])
        for local in range(ranks_per_node):
            out.append(RunDigest.of(cfg, topology, node=node, rank=node * ranks_per_node + local))
    return out


def test_ranks_that_agree_pass_quietly() -> None:
    colocated = Topology.colocated_on(4)
    check_agreement(digests([(colocated, []), (colocated, [])], ranks_per_node=2))
    split = Topology(1, 1)
    check_agreement(digests([(split, []), (split, [])]))


def test_nodes_on_different_topologies_fail_naming_each_node_and_the_fix() -> None:
    with pytest.raises(ConfigError) as caught:
        check_agreement(digests([(Topology.colocated_on(2), []), (Topology(1, 1), [])]))
    message, hint = caught.value.message, caught.value.hint or ""
    assert "disagree on the topology" in message
    assert "node 0 (rank 0): colocated on 2 ranks, config " in message
    assert "node 1 (rank 1): split 1+1, config " in message
    assert (
        'topology.mode="colocated"' in hint and "topology.targets=N" in hint and "free the GPU memory" in hint
    )


def test_ranks_of_one_node_are_named_as_a_range() -> None:
    mixed = digests([(Topology.colocated_on(4), []), (Topology(2, 2), [])], ranks_per_node=2)
    with pytest.raises(ConfigError, match=r"node 0 \(ranks 0-1\).*node 1 \(ranks 2-3\)"):
        check_agreement(mixed)


def test_a_different_graph_config_on_one_node_fails() -> None:
    colocated = Topology.colocated_on(2)
    with pytest.raises(ConfigError) as caught:
        check_agreement(digests([(colocated, []), (colocated, ["data.seq_len=96"])]))
    assert "disagree on the graph config" in caught.value.message
    assert "same config file" in (caught.value.hint or "")


def test_per_node_paths_do_not_count_and_the_digest_fits_an_int64_row() -> None:
    here = load_config("tiny-cpu", [*SHORT, "output.dir='/disk/a'"])
    there = load_config("tiny-cpu", [*SHORT, "output.dir='/disk/b'"])
    assert graph_config_hash(here) == graph_config_hash(there)  # each node may write its own disk
    assert graph_config_hash(here) != graph_config_hash(load_config("tiny-cpu", ["optim.steps=5"]))
    digest = RunDigest.of(here, Topology(1, 1), node=1, rank=1)
    row = digest.to_row()
    assert len(row) == RunDigest.WIDTH and all(-(2**63) <= v < 2**63 for v in row)
    assert RunDigest.from_row(row) == digest


def test_a_process_count_that_fits_no_nodes_topology_names_the_likely_cause() -> None:
    """Nodes whose choices differ in size (colocated 2 on node 0, colocated 4 on node 1: torchrun starts
    1 + 2) fail before the process group forms; over several nodes the hint says why and how to pin it."""
    cfg = load_config("tiny-cpu", [*SHORT, 'topology.mode="colocated"', "topology.ranks=2"])
    with pytest.raises(ConfigError) as caught:
        resolve_topology(cfg.topology, world_size=3, nodes=2)
    assert "torchrun started 3 processes" in caught.value.message
    assert "with 2 nodes, they likely chose different topologies" in (caught.value.hint or "")
    with pytest.raises(ConfigError) as alone:
        resolve_topology(cfg.topology, world_size=3)
    assert alone.value.hint is None  # one node: the message's --nproc-per-node is the fix
