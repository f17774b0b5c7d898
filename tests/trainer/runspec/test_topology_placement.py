"""Placement by node: over several nodes each node runs its own targets and drafters and a target feeds only
its own node's drafters (issue 59); one node keeps the one list it always had; `placement = "world"` keeps
that list over every node, and then says which pairs cross."""

from __future__ import annotations

from collections import Counter

import pytest

from dflash_base.errors import ConfigError
from trainer.run.schedule import RunPlan, target_work
from trainer.runspec.config import load_config
from trainer.runspec.topology import RunDigest, Topology, check_agreement, check_placement, resolve_topology


def test_one_node_keeps_the_one_list() -> None:
    t = Topology(5, 3)
    assert [r for r in range(8) if t.is_target(r)] == [0, 1, 2, 3, 4]
    assert t.drafter_ranks == [5, 6, 7]
    assert [t.producer_of(i) for i in range(12)] == [i % 5 for i in range(12)]
    assert all(t.node_of(r) == 0 for r in range(8)) and t.crossing_pairs() == []


def test_two_nodes_of_eight_run_five_plus_three_each_and_no_batch_leaves_its_node() -> None:
    """The issue's example: 10 + 6 on two nodes of 8 GPUs. One list put 8 targets on node 0 and the 2 others
    with all 6 drafters on node 1; by node, ranks 0-4 and 8-12 capture, 5-7 and 13-15 train."""
    t = Topology.split_per_node(5, 3, nodes=2)
    assert (t.targets, t.drafters, t.ranks_per_node) == (10, 6, 8)
    assert [r for r in range(16) if t.is_target(r)] == [0, 1, 2, 3, 4, 8, 9, 10, 11, 12]
    assert t.drafter_ranks == [5, 6, 7, 13, 14, 15]
    assert [t.drafter_index(r) for r in t.drafter_ranks] == list(range(6))
    for i in range(600):
        producer, consumer = t.producer_of(i), t.drafter_rank(t.consumer_of(i))
        assert t.is_target(producer) and not t.is_target(consumer)
        assert t.node_of(producer) == t.node_of(consumer), i
    assert t.crossing_pairs() == [] and t.crossing_reason() is None
    # every target of a node makes an equal share of its node's batches
    assert set(Counter(t.producer_of(i) for i in range(t.targets * t.drafters * 4)).values()) == {24}
    pairs = t.pairs_json()
    assert len(pairs) == 2 * 5 * 3 and all(p["target_node"] == p["drafter_node"] for p in pairs)


def test_one_list_over_two_nodes_crosses_and_says_why() -> None:
    t = Topology(10, 6, nodes=2, per_node=False)
    assert [r for r in range(16) if t.is_target(r)] == list(range(10))
    crossing = t.crossing_pairs()
    assert crossing and all(t.node_of(a) == 0 and t.node_of(b) == 1 for a, b in crossing)
    reason = t.crossing_reason() or ""
    assert f"{len(crossing)} of {len(t.pairs())} target -> drafter pairs cross nodes" in reason
    assert 'topology.placement = "world"' in reason


def test_colocated_pairs_each_rank_with_itself() -> None:
    t = Topology.colocated_on(4, nodes=2)
    assert t.pairs() == [(0, 0), (1, 1), (2, 2), (3, 3)] and t.crossing_pairs() == []
    assert [p["target_node"] for p in t.pairs_json()] == [0, 0, 1, 1]


def test_per_node_counts_must_give_every_node_both_roles() -> None:
    with pytest.raises(ValueError, match="same targets and drafters on each of 2 nodes"):
        Topology(3, 1, nodes=2)


@pytest.mark.parametrize(("targets", "drafters", "nodes"), [(1, 1, 1), (2, 1, 2), (5, 3, 2), (1, 3, 4)])
def test_targets_make_every_batch_once_and_end_only_to_the_drafters_they_feed(
    targets: int, drafters: int, nodes: int
) -> None:
    t = Topology.split_per_node(targets, drafters, nodes)
    plan = RunPlan(batches_per_epoch=1000, total_steps=6, drafters=t.drafters, accum=2)
    made = [
        i
        for rank in range(t.world_size)
        if t.is_target(rank)
        for kind, i in target_work(t, rank, plan, 1, eval_every=3, eval_batches=5)
        if kind == "train"
    ]
    assert sorted(made) == list(range(1 * 2 * t.drafters, 6 * 2 * t.drafters))
    for rank in t.drafter_ranks:
        feeding = t.targets_feeding(rank)
        assert feeding and all(t.node_of(src) == t.node_of(rank) for src in feeding)


def test_the_trainer_resolves_a_split_per_node_from_torchruns_node_count() -> None:
    cfg = load_config("tiny-cpu-2t1d", ["optim.steps=4"])
    t = resolve_topology(cfg.topology, world_size=6, nodes=2)
    assert (t.targets, t.drafters, t.nodes, t.placement) == (4, 2, 2, "node")
    with pytest.raises(ConfigError, match=r"use --nproc-per-node 3"):
        resolve_topology(cfg.topology, world_size=4, nodes=2)
    world = load_config("tiny-cpu", ["optim.steps=4", 'topology.placement="world"'])
    t = resolve_topology(world.topology, world_size=2, nodes=2)
    assert (t.targets, t.drafters, t.placement) == (1, 1, "world") and t.crossing_pairs() == [(0, 1)]


def test_nodes_that_differ_in_placement_disagree_on_the_topology() -> None:
    cfg = load_config("tiny-cpu", ["optim.steps=4"])
    node = Topology.split_per_node(1, 1, nodes=2)
    world = Topology(2, 2, nodes=2, per_node=False)
    rows = [RunDigest.of(cfg, node, 0, 0), RunDigest.of(cfg, node, 0, 1)]
    rows += [RunDigest.of(cfg, world, 1, 2), RunDigest.of(cfg, world, 1, 3)]
    with pytest.raises(ConfigError, match=r"disagree on the topology.*split 2\+2 over the world"):
        check_agreement(rows)


def test_a_rank_off_its_node_is_refused_naming_it() -> None:
    cfg = load_config("tiny-cpu", ["optim.steps=4"])
    t = Topology.split_per_node(1, 1, nodes=2)
    check_placement([RunDigest.of(cfg, t, r // 2, r) for r in range(4)], t)
    with pytest.raises(ConfigError, match=r"rank 2 runs on node 0, but .* places it on node 1"):
        check_placement([RunDigest.of(cfg, t, 0 if r < 3 else 1, r) for r in range(4)], t)
