"""The launch plan places a split by node over several nodes (issue 59): `train --dry-run --json` and the plan's
table show the pairs with their nodes; a launch whose pairs cross nodes says so and why."""

from __future__ import annotations

import json

from dflash_doctor.cli import run
from dflash_doctor.findings import Severity
from dflash_doctor.launch.plan import rank_ranges
from tests.fakeenv import FakeSite
from tests.launch.test_launch_checks import findings
from tests.launch.test_topology_choice import inventory, plan_for
from tests.launch.test_train_gate import launches  # noqa: F401  (fixture)

TWO_NODES = ["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "127.0.0.1:29400"]


def test_dry_run_json_shows_every_pair_on_its_own_node(launches: list[list[str]], capsys) -> None:  # noqa: F811
    args = ["train", "--config", "tiny-cpu-2t1d", "--no-deep", "--dry-run", "--json", *TWO_NODES]
    assert run(args) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    topology = plan["topology"]
    assert (topology["targets"], topology["drafters"], topology["nodes"], topology["placement"]) == (
        4,
        2,
        2,
        "node",
    )
    assert topology["pairs"] == [
        {"target_rank": 0, "drafter_rank": 2, "target_node": 0, "drafter_node": 0},
        {"target_rank": 1, "drafter_rank": 2, "target_node": 0, "drafter_node": 0},
        {"target_rank": 3, "drafter_rank": 5, "target_node": 1, "drafter_node": 1},
        {"target_rank": 4, "drafter_rank": 5, "target_node": 1, "drafter_node": 1},
    ]
    assert topology["crossing"] is None
    assert [(r["node"], r["role"], r["peers"]) for r in plan["roles"][3:]] == [
        (1, "target", [5]),
        (1, "target", [5]),
        (1, "drafter", [3, 4]),
    ]
    assert plan["nproc_per_node"] == 3 and "--nproc-per-node=3" in plan["command"]
    assert launches == []


def test_the_plans_table_shows_the_pairs_and_that_none_crosses(launches: list[list[str]], capsys) -> None:  # noqa: F811
    assert run(["train", "--config", "tiny-cpu-2t1d", "--no-deep", "--dry-run", *TWO_NODES]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "pairs" in out and "<- 3-4" in out and "-> 5" in out
    assert "pairs: 4 target -> drafter pairs, none crosses nodes" in out


def test_one_list_over_nodes_is_said_to_cross_and_why(launches: list[list[str]], capsys) -> None:  # noqa: F811
    world = ["--set", 'topology.placement="world"', "--set", 'topology.mode="split"']
    assert run(["train", "--config", "tiny-cpu", "--no-deep", "--dry-run", "--json", *TWO_NODES, *world]) == 0
    report = json.loads(capsys.readouterr().out)
    topology = report["plan"]["topology"]
    assert topology["pairs"] == [{"target_rank": 0, "drafter_rank": 1, "target_node": 0, "drafter_node": 1}]
    assert "1 of 1 target -> drafter pairs cross nodes" in topology["crossing"]
    crossing = next(f for f in report["findings"] if f["id"] == "launch.topology.crossing")
    assert crossing["severity"] == "warn" and 'topology.placement = "node"' in crossing["remedy"]
    assert crossing["evidence"]["pairs"] == ["rank 0 (node 0) -> rank 1 (node 1)"]


def test_the_storys_split_on_two_nodes_of_eight_stays_on_each_node(site: FakeSite) -> None:
    """qwen3-8b-5t3d on 2 x 8 H200s: 5+3 on each node, 10+6 in all; the one list put 8 targets on node 0."""
    got = findings(site, "qwen3-8b-5t3d", inventory(8), nnodes=2)
    assert got["launch.topology"].severity is Severity.OK and "launch.topology.crossing" not in got
    assert "(5 + 3 on each of 2 nodes)" in got["launch.topology"].summary
    plan = plan_for("qwen3-8b-5t3d", 8, options=_two())
    assert [r.role for r in plan.roles if r.node == 0] == ["target"] * 5 + ["drafter"] * 3
    assert all(p["target_node"] == p["drafter_node"] for p in plan.choice.to_json()["pairs"])
    # the one list: 5+3 over both nodes, 4 ranks a node: targets 0-3 on node 0 feed drafters on node 1
    world = findings(site, "qwen3-8b-5t3d", inventory(8), ["topology.placement='world'"], nnodes=2)
    assert world["launch.topology.crossing"].severity is Severity.WARN
    assert "cross nodes" in world["launch.topology.crossing"].summary


def _two():
    from dflash_doctor.launch.plan import TorchrunOptions

    return TorchrunOptions(nnodes=2, node_rank=0, rdzv_endpoint="10.0.0.1:29400")


def test_rank_ranges_fold_runs() -> None:
    assert rank_ranges([0, 1, 2, 3, 4, 8, 10, 11]) == "0-4, 8, 10-11"
    assert rank_ranges((5,)) == "5" and rank_ranges([]) == ""
