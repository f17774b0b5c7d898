"""launch.*: topology and memory against the devices; each fires and each stays quiet."""

from __future__ import annotations

from dataclasses import replace

import pytest

from checks import launch as launch_checks
from dflash_doctor.context import CheckContext, CheckOptions
from dflash_doctor.env.gpus import GpuDevice, GpuInventory, GpuUnavailable, launch_view
from dflash_doctor.findings import Severity
from dflash_doctor.launch.plan import NodeFacts, TorchrunOptions, build_launch_plan
from dflash_doctor.registry import run_checks
from tests.conftest import env_for
from tests.fakeenv import FakeSite
from trainer.runspec.config import load_config
from trainer.runspec.target_shapes import target_hf_config

GIB = 1024**3


def h200(index: int, free_gib: float = 139.0) -> GpuDevice:
    total = int(143.7 * GIB)
    free = int(free_gib * GIB)
    return GpuDevice(index, "NVIDIA H200", None, (9, 0), total, free, total - free)


def findings(
    site: FakeSite,
    config_name: str,
    gpus: object,
    overrides: list[str] | None = None,
    nnodes: int = 1,
    free_bytes: int | None = None,
):
    """The launch checks' findings by id; `free_bytes`: what the gate gives `auto` (None: unknown)."""
    cfg = load_config(config_name, overrides or [])
    target = target_hf_config(cfg.target.path)
    count = len(gpus.devices) if isinstance(gpus, GpuInventory) else 0
    plan = build_launch_plan(
        cfg,
        cfg_path := __file__,
        target,
        "/fake/python",
        NodeFacts(count, gpu_free_bytes=free_bytes),
        TorchrunOptions(nnodes=nnodes)
        if nnodes == 1
        else TorchrunOptions(nnodes=nnodes, node_rank=0, rdzv_endpoint="10.0.0.1:29400"),
    )
    assert cfg_path
    ctx = CheckContext(env_for(site), CheckOptions(config=cfg))
    ctx.options.extra["launch_plan"] = plan
    ctx._shared["gpus"] = gpus
    return {f.id: f for r in run_checks(ctx, ["launch"]) for f in r.findings}


def test_cpu_topology_and_memory_quiet(site: FakeSite) -> None:
    got = findings(site, "tiny-cpu", GpuUnavailable("no driver"))
    assert got["launch.topology"].severity is Severity.OK
    assert got["launch.memory"].severity is Severity.OK


def test_cuda_config_without_gpu_fails(site: FakeSite) -> None:
    got = findings(site, "tiny-cpu", GpuUnavailable("NVML Shared Library Not Found"), ["run.device='cuda'"])
    assert got["launch.topology.no_gpu"].severity is Severity.FAIL
    assert "NVML" in got["launch.topology.no_gpu"].evidence["reason"]


def test_story_topology_on_two_gpus_fails_and_on_eight_passes(site: FakeSite) -> None:
    over = ["topology.targets=5", "topology.drafters=3", "run.device='cuda'"]
    two = findings(site, "tiny-cpu", GpuInventory("580.159.04", 13000, [h200(0), h200(1)]), over)
    bad = two["launch.topology.too_few_gpus"]
    assert bad.severity is Severity.FAIL and bad.evidence["needed"] == 8 and bad.evidence["found"] == 2
    eight = findings(site, "tiny-cpu", GpuInventory("580.159.04", 13000, [h200(i) for i in range(8)]), over)
    assert eight["launch.topology"].severity is Severity.OK
    assert "launch.topology.too_few_gpus" not in eight


def test_uneven_nodes_fail(site: FakeSite) -> None:
    """One list of 1 + 2 ranks cannot be shared by 2 nodes; by node (the default) each node runs 1 + 2."""
    world = ["topology.drafters=2", "topology.placement='world'"]
    got = findings(site, "tiny-cpu", GpuUnavailable("none"), world, nnodes=2)
    assert got["launch.topology.nodes"].severity is Severity.FAIL
    by_node = findings(site, "tiny-cpu", GpuUnavailable("none"), ["topology.drafters=2"], nnodes=2)
    assert "launch.topology.nodes" not in by_node
    assert not [
        f for f in by_node.values() if f.id.startswith("launch.topology") and f.severity is Severity.FAIL
    ]


def test_memory_over_budget_tight_and_fitting_on_gpus(site: FakeSite) -> None:
    over = ["run.device='cuda'"]
    qwen = [
        "target.path='random:qwen3-8b'",
        "data.kind='random'",
        "drafter.layers=5",
        "drafter.block_size=16",
        "optim.anchors=512",
        "data.seq_len=3072",
        "optim.batch_size=1",
        *over,
    ]
    full = findings(site, "tiny-cpu", GpuInventory("580", 13000, [h200(0), h200(1)]), qwen)
    assert full["launch.memory"].severity is Severity.OK
    need = max(
        float(full["launch.memory"].evidence[k].split()[0]) for k in ("target_estimate", "drafter_estimate")
    )
    tight = findings(
        site, "tiny-cpu", GpuInventory("580", 13000, [h200(0, need * 1.05), h200(1, need * 1.05)]), qwen
    )
    assert tight["launch.memory.tight"].severity is Severity.WARN
    busy = findings(site, "tiny-cpu", GpuInventory("580", 13000, [h200(0, 10.0), h200(1, 139.0)]), qwen)
    failed = busy["launch.memory.over_budget"]
    assert failed.severity is Severity.FAIL and "cuda:0" in failed.summary


def eight_h200s(busy: int | None = None) -> GpuInventory:
    """A host of 8 H200s as NVML lists them (GPU `busy`, if any, has 10 GiB free)."""
    return GpuInventory("580", 13000, [h200(i, 10.0 if i == busy else 139.0) for i in range(8)])


def test_gpus_hidden_by_cuda_visible_devices_are_not_counted(site: FakeSite) -> None:
    """NVML lists 8 GPUs; CUDA_VISIBLE_DEVICES=0,1 leaves the launch 2: the 5+3 split is refused, naming
    the hidden GPUs and the variable; with all 8 listed it passes and says none is hidden."""
    over = ["topology.targets=5", "topology.drafters=3", "run.device='cuda'"]
    two = findings(site, "tiny-cpu", launch_view(eight_h200s(), "0,1"), over)
    bad = two["launch.topology.too_few_gpus"]
    assert bad.severity is Severity.FAIL and bad.evidence["found"] == 2
    assert "2 found (6 more hidden by CUDA_VISIBLE_DEVICES='0,1')" in bad.summary
    assert "unset it to use all 8" in (bad.remedy or "")
    assert len(bad.evidence["hidden_by_CUDA_VISIBLE_DEVICES"]) == 6
    every = findings(site, "tiny-cpu", launch_view(eight_h200s(), "7,6,5,4,3,2,1,0"), over)
    assert every["launch.topology"].severity is Severity.OK
    assert every["launch.topology"].evidence["hidden_by_CUDA_VISIBLE_DEVICES"] == []


def test_memory_plan_sizes_the_gpus_in_cuda_visible_devices_order(site: FakeSite) -> None:
    """cuda:0 is the first GPU the variable lists: a busy GPU 5 listed first is what rank 0 gets."""
    qwen = [
        "target.path='random:qwen3-8b'",
        "data.kind='random'",
        "drafter.layers=5",
        "optim.anchors=512",
        "data.seq_len=3072",
        "optim.batch_size=1",
        "run.device='cuda'",
        'topology.mode="split"',
    ]
    fits = findings(site, "tiny-cpu", launch_view(eight_h200s(busy=5), "0,1"), qwen)
    assert fits["launch.memory"].severity is Severity.OK
    busy_first = findings(site, "tiny-cpu", launch_view(eight_h200s(busy=5), "5,1"), qwen)
    failed = busy_first["launch.memory.over_budget"]
    assert (
        failed.severity is Severity.FAIL and "cuda:0" in failed.summary and "10.0 GiB free" in failed.summary
    )


def test_memory_over_budget_on_cpu_host(site: FakeSite, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch_checks, "host_available_bytes", lambda: 64 * 1024**2)
    got = findings(site, "tiny-cpu", GpuUnavailable("none"))
    assert got["launch.memory.over_budget"].severity is Severity.FAIL


def test_plan_roles_and_command(site: FakeSite) -> None:
    cfg = load_config("tiny-cpu", ["topology.targets=2"])
    plan = build_launch_plan(cfg, __file__, target_hf_config("tiny"), "/py", NodeFacts(0))
    assert [(r.rank, r.role) for r in plan.roles] == [(0, "target"), (1, "target"), (2, "drafter")]
    assert plan.command[:3] == ["/py", "-m", "torch.distributed.run"]
    assert "--nproc-per-node=3" in plan.command and "--standalone" in plan.command
    multi = build_launch_plan(
        cfg,
        __file__,
        target_hf_config("tiny"),
        "/py",
        NodeFacts(0),
        replace(TorchrunOptions(), nnodes=3, node_rank=0, rdzv_endpoint="h:29400", rdzv_id="j"),
    )
    assert "--nnodes=3" in multi.command and "--rdzv-endpoint=h:29400" in multi.command
    # by node (the default): every node runs the config's 2 + 1; one list: 3 ranks over 3 nodes
    assert "--nproc-per-node=3" in multi.command and "--standalone" not in multi.command
    world = load_config("tiny-cpu", ["topology.targets=2", "topology.placement='world'"])
    one_list = build_launch_plan(
        world,
        __file__,
        target_hf_config("tiny"),
        "/py",
        NodeFacts(0),
        replace(TorchrunOptions(), nnodes=3, node_rank=0, rdzv_endpoint="h:29400", rdzv_id="j"),
    )
    assert "--nproc-per-node=1" in one_list.command
