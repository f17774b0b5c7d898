"""topology.mode: auto picks the faster design that fits the GPUs the launch uses, and says why;
split and colocated are honoured; a colocated launch that does not fit is refused naming the split."""

from __future__ import annotations

import json

import pytest

from dflash_doctor.cli import run
from dflash_doctor.env import gpus as gpus_module
from dflash_doctor.env.gpus import GpuInventory
from dflash_doctor.findings import Severity
from dflash_doctor.launch.plan import NodeFacts, TorchrunOptions, build_launch_plan
from dflash_doctor.launch.split import RoleRates
from tests.fakeenv import FakeSite
from tests.fakenvml import FakeNvml, h200s
from tests.launch.test_launch_checks import findings, h200
from tests.launch.test_train_gate import launches  # noqa: F401  (fixture)
from trainer.runspec.config import load_config
from trainer.runspec.target_shapes import target_hf_config

GIB = 1024**3


def inventory(count: int, free_gib: float = 139.0) -> GpuInventory:
    return GpuInventory("580.159.04", 13000, [h200(i, free_gib) for i in range(count)])


def plan_for(config: str, gpus: int, overrides: list[str] | None = None, free_gib: float | None = None, **kw):
    cfg = load_config(config, overrides or [])
    free = int(free_gib * GIB) if free_gib is not None else None
    return build_launch_plan(
        cfg, __file__, target_hf_config(cfg.target.path), "/py", NodeFacts(gpus, gpu_free_bytes=free), **kw
    )


@pytest.mark.parametrize("config", ["qwen3-8b-b16", "seed-b32"])
@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_shipped_gpu_configs_run_on_1_2_and_8_gpus(site: FakeSite, config: str, gpus: int) -> None:
    got = findings(site, config, inventory(gpus))
    assert got["launch.topology"].severity is Severity.OK, got["launch.topology"]
    assert got["launch.memory"].severity is Severity.OK, got["launch.memory"]
    assert "launch.topology.too_few_gpus" not in got
    assert f"on {gpus} of {gpus} GPUs" in got["launch.topology"].summary
    assert got["launch.topology"].evidence["why"]  # the gate says why this topology


def test_auto_on_one_gpu_is_colocated_and_the_workers_are_told() -> None:
    plan = plan_for("qwen3-8b-b16", 1)
    assert plan.mode == "colocated" and plan.world_size == 1 and plan.nproc_per_node == 1
    assert [(r.rank, r.role, r.device) for r in plan.roles] == [(0, "colocated", "cuda:0")]
    assert list(plan.memory) == ["colocated"]
    assert plan.command[-4:] == ["--set", 'topology.mode="colocated"', "--set", "topology.ranks=1"]
    assert "a split needs 2" in plan.choice.reason


def test_auto_picks_colocated_when_it_projects_faster() -> None:
    """b16 on 8 H200s: colocated 8 x the measured end-to-end rate against the best split 3+5 (5 x 7.14),
    both read from the shipped rates table, each drafter step also waiting for the gradient all-reduce."""
    from dflash_doctor.launch.split import load_role_rates

    rate = load_role_rates()["qwen3-8b-b16"].colocated_samples_s
    assert rate is not None
    plan = plan_for("qwen3-8b-b16", 8)
    choice = plan.choice
    sync = choice.sync
    assert sync is not None and sync.gradient_bytes > 4e9  # the 5-layer Qwen3-8B drafter's fp32 gradients
    assert plan.mode == "colocated" and plan.nproc_per_node == 8
    expected = 8 * sync.rate(rate, 8) * 3072
    assert expected < 8 * rate * 3072  # the all-reduce costs something on 8 ranks
    assert choice.colocated.tok_s == pytest.approx(expected, rel=1e-3) and choice.colocated.measured
    assert (choice.split.targets, choice.split.drafters) == (3, 5)
    assert choice.colocated.tok_s > choice.split.tok_s
    colocated_k = f"{choice.colocated.tok_s / 1000:.1f}"
    split_k = f"{choice.split.tok_s / 1000:.1f}"
    assert f"auto: colocated {colocated_k} >= best split {split_k} Ktok/s on 8 GPUs" in choice.reason
    lines = "\n".join(choice.lines())
    assert (
        f"colocated on 8 GPUs: {colocated_k} Ktok/s (measured rate)" in lines
        and "best split of 8 GPUs: 3+5" in lines
    )
    assert "gradient all-reduce:" in lines and "GB/s NVLink bus bandwidth" in lines  # named in --dry-run


def test_the_all_reduce_is_ring_bytes_over_the_bus_and_free_for_one_drafter() -> None:
    from dflash_doctor.launch.split import GradientSync

    sync = GradientSync(gradient_bytes=4_000_000_000, sequences_per_step=2, bus_bytes_s=400e9)
    assert sync.seconds(1) == 0.0  # nothing to average
    assert sync.seconds(2) == pytest.approx(0.010)  # 2 x 1/2 x 4 GB / 400 GB/s
    assert sync.seconds(8) == pytest.approx(0.0175)  # 2 x 7/8 x 4 GB / 400 GB/s
    # 2 sequences at 10/s is 0.2 s a step; + 17.5 ms of all-reduce: 2 / 0.2175 samples/s
    assert sync.rate(10.0, 8) == pytest.approx(2 / 0.2175)
    assert sync.rate(10.0, 1) == pytest.approx(10.0)


def test_auto_picks_the_split_when_it_projects_faster() -> None:
    slow_drafter = RoleRates("r", 3072, 512, 16, target_samples_s=40.0, drafter_samples_s=4.0)
    plan = plan_for("qwen3-8b-b16", 8, rates={"r": slow_drafter})
    # colocated: 8 / (1/40 + 1/4) = 29.1 samples/s; the best split, 1+7: min(40, 28) = 28: colocated wins
    assert plan.mode == "colocated"
    fast_target = RoleRates("r", 3072, 512, 16, target_samples_s=8.0, drafter_samples_s=8.0)
    plan = plan_for("qwen3-8b-b16", 8, rates={"r": fast_target})  # colocated 32, split 4+4 = 32: a tie
    assert plan.mode == "colocated"
    measured_slow = RoleRates("r", 3072, 512, 16, 14.0, 7.0, colocated_samples_s=2.0)
    plan = plan_for("qwen3-8b-b16", 8, rates={"r": measured_slow})
    assert (plan.mode, plan.targets, plan.drafters) == ("split", 3, 5)
    assert "auto: best split" in plan.choice.reason
    assert [r.role for r in plan.roles] == ["target"] * 3 + ["drafter"] * 5
    assert plan.command[-6:] == [
        "--set", 'topology.mode="split"', "--set", "topology.targets=3", "--set", "topology.drafters=5",
    ]  # fmt: skip


def test_auto_picks_the_split_when_colocated_does_not_fit() -> None:
    plan = plan_for("qwen3-8b-b16", 8, free_gib=40.0)  # colocated 43.1 GiB, split roles 30.1 GiB at most
    assert (plan.mode, plan.targets, plan.drafters) == ("split", 3, 5)
    assert "colocated does not fit" in plan.choice.reason


def test_targets_and_drafters_still_force_a_split() -> None:
    plan = plan_for("qwen3-8b-b16", 2, ["topology.targets=1", "topology.drafters=1"])
    assert (plan.mode, plan.targets, plan.drafters) == ("split", 1, 1)
    assert "configured split" in plan.choice.reason


def test_a_colocated_launch_that_does_not_fit_is_refused_naming_the_split(site: FakeSite) -> None:
    got = findings(site, "qwen3-8b-b16", inventory(8, free_gib=40.0), ['topology.mode="colocated"'])
    bad = got["launch.memory.over_budget"]
    assert bad.severity is Severity.FAIL
    assert 'topology.mode = "split", topology.targets = 3, topology.drafters = 5' in bad.remedy
    one = findings(site, "qwen3-8b-b16", inventory(1, free_gib=40.0), ['topology.mode="colocated"'])
    assert "fits on 2 such GPUs" in one["launch.memory.over_budget"].remedy


def test_colocated_ranks_that_do_not_split_over_nodes_fail(site: FakeSite) -> None:
    got = findings(site, "tiny-cpu", gpus_module.GpuUnavailable("none"), ['topology.mode="colocated"', "topology.ranks=3"], nnodes=2)  # fmt: skip
    bad = got["launch.topology.nodes"]
    assert bad.severity is Severity.FAIL and "topology.ranks (3)" in bad.remedy


def test_auto_over_nodes_says_what_decided_and_how_to_pin_it() -> None:
    """Each node's launcher decides alone: the plan says whether this node's free memory changed the pick
    and gives the flags that pin it on every node. seed-b32: at its 2.5 s steps the gradient all-reduce
    between nodes costs little, so colocated wins where it fits (it needs 69 GiB a GPU, the split 62)."""
    two = TorchrunOptions(nnodes=2, node_rank=0, rdzv_endpoint="10.0.0.1:29400")
    shared = plan_for("seed-b32", 8, free_gib=139.0, options=two)
    assert shared.mode == "colocated" and not shared.choice.node_local
    line = shared.choice.lines()[-1]
    assert "2 nodes, each launcher deciding alone" in line and "free memory did not change it" in line
    assert line.endswith("pin it on every node: --set 'topology.mode=\"colocated\"' --set topology.ranks=16")
    busy = plan_for("seed-b32", 8, free_gib=65.0, options=two)  # a stray process on this node
    assert busy.mode == "split" and busy.choice.node_local
    line = busy.choice.lines()[-1]
    assert "this node's free GPU memory (65.0 GiB) decided it" in line
    # the split is one node's, the same on every node: 5+3 here, 10+6 in all, no pair leaving its node
    assert (busy.targets, busy.drafters) == (10, 6)
    assert "--set topology.targets=5 --set topology.drafters=3" in line
    assert busy.choice.to_json()["node_local"] is True
    assert busy.choice.to_json()["crossing"] is None
    assert [r.role for r in busy.roles if r.node == 1] == ["target"] * 5 + ["drafter"] * 3
    assert "5+3 on each node (10+6" in " ".join(busy.choice.lines())


def test_one_node_or_a_set_mode_has_no_nodes_line() -> None:
    assert not any(
        "nodes, each" in line for line in plan_for("qwen3-8b-b16", 8, free_gib=40.0).choice.lines()
    )
    pinned = plan_for(
        "qwen3-8b-b16",
        8,
        ['topology.mode="split"'],
        free_gib=40.0,
        options=TorchrunOptions(nnodes=2, node_rank=0, rdzv_endpoint="10.0.0.1:29400"),
    )
    assert not pinned.choice.node_local and not any("nodes, each" in line for line in pinned.choice.lines())


def test_the_gate_warns_when_this_nodes_free_memory_chose_the_topology(site: FakeSite) -> None:
    got = findings(site, "seed-b32", inventory(8, free_gib=65.0), nnodes=2, free_bytes=65 * GIB)
    warned = got["launch.topology.node_local"]
    assert warned.severity is Severity.WARN and "this node's free GPU memory (65.0 GiB)" in warned.summary
    assert "pin the topology on every node: --set 'topology.mode=\"split\"'" in warned.remedy


def test_the_gate_is_quiet_when_every_node_would_choose_alike(site: FakeSite) -> None:
    roomy = findings(site, "qwen3-8b-b16", inventory(8), nnodes=2, free_bytes=139 * GIB)
    assert "launch.topology.node_local" not in roomy and roomy["launch.topology"].severity is Severity.OK
    one_node = findings(site, "qwen3-8b-b16", inventory(8, free_gib=40.0), free_bytes=40 * GIB)
    assert "launch.topology.node_local" not in one_node


def test_auto_on_cpu_is_one_colocated_process_per_node() -> None:
    plan = plan_for("tiny-cpu", 0, ['topology.mode="auto"'])
    assert (plan.mode, plan.world_size, plan.device_type) == ("colocated", 1, "cpu")
    two = plan_for(
        "tiny-cpu",
        0,
        ['topology.mode="colocated"'],
        options=TorchrunOptions(nnodes=2, node_rank=0, rdzv_endpoint="10.0.0.1:29400"),
    )
    assert (two.world_size, two.nproc_per_node) == (2, 1) and [r.node for r in two.roles] == [0, 1]


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_dry_run_shows_the_choice_and_both_projections(launches, monkeypatch, capsys, gpus: int) -> None:  # noqa: F811
    monkeypatch.setattr(gpus_module, "probe_gpus", lambda: inventory(gpus))
    run(["train", "--config", "seed-b32", "--no-deep", "--dry-run", "--json"])
    out = json.loads(capsys.readouterr().out)
    topology = out["plan"]["topology"]
    assert out["plan"]["mode"] == topology["mode"] == "colocated" and topology["gpus"] == gpus
    assert topology["requested"] == "auto" and topology["colocated"]["tok_s"] > 0
    assert (topology["split"] is None) == (gpus == 1)
    assert not [f for f in out["failing"] if f.startswith("launch.")]
    assert launches == []
    run(["train", "--config", "seed-b32", "--no-deep", "--dry-run"])
    text = capsys.readouterr().out
    count = f"{gpus} GPU{'s' if gpus > 1 else ''}"
    assert f"colocated on {count}:" in text and f"best split of {count}:" in text


def test_a_misspelt_mode_is_exit_2_and_starts_nothing(launches, capsys) -> None:  # noqa: F811
    assert run(["train", "--config", "tiny-cpu", "--no-deep", "--set", "topology.mode=colocate"]) == 2
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert 'topology.mode: must be one of "auto", "split", "colocated", got "colocate"' in err
    assert launches == []


def test_auto_sizes_the_gpus_cuda_visible_devices_leaves(launches, monkeypatch, capsys) -> None:  # noqa: F811
    """The gate reads NVML (8 GPUs) through CUDA_VISIBLE_DEVICES: auto decides for the 2 the workers see."""
    monkeypatch.setattr(gpus_module, "_binding", lambda: FakeNvml(h200s(8)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,2")
    run(["train", "--config", "seed-b32", "--no-deep", "--dry-run", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["topology"]["gpus"] == 2 and out["plan"]["nproc_per_node"] == 2
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    run(["train", "--config", "seed-b32", "--no-deep", "--dry-run", "--json"])
    assert json.loads(capsys.readouterr().out)["plan"]["topology"]["gpus"] == 8
    assert launches == []


def test_one_gpu_or_process_says_a_split_needs_two_in_its_own_unit() -> None:
    gpu = plan_for("qwen3-8b-b16", 1).choice.lines()
    assert any("best split of 1 GPU: needs 2 GPUs;" in line for line in gpu), gpu
    cpu = plan_for("tiny-cpu", 0, ['topology.mode="colocated"']).choice.lines()
    assert any("best split of 1 process: needs 2 processes;" in line for line in cpu), cpu


def test_a_held_out_share_smaller_than_a_batch_is_planned_not_refused(launches, capsys) -> None:  # noqa: F811
    """tiny-cpu holds out 10%: of 64 sequences that is 6, less than its batch of 8. It was refused while
    held-out scoring ran whole batches only; the last batch is padded now (issue 38 D8), so it is planned."""
    args = ["train", "--config", "tiny-cpu", "--no-deep", "--set", "data.num_samples=64"]
    assert run([*args, "--dry-run"]) == 0
    assert "fewer than one batch" not in capsys.readouterr().err
    assert launches == []
