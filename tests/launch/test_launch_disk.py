"""launch.disk: what a run writes (checkpoints x keep, export, metrics, the compile-cache snapshot) against
the free space of each file system it writes to; refused when it cannot fit, warned near the edge, shown in
the plan and `--dry-run`. Free space is faked: no test fills a disk here."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from checks import launch as launch_checks
from dflash_doctor.cli import run
from dflash_doctor.context import CheckContext, CheckOptions
from dflash_doctor.env import gpus as gpus_module
from dflash_doctor.env.gpus import GpuInventory, GpuUnavailable
from dflash_doctor.findings import Severity
from dflash_doctor.launch import gate
from dflash_doctor.launch.disk_plan import (
    DiskFacts,
    checkpoint_bytes,
    checkpoint_saves,
    new_checkpoints_at_peak,
)
from dflash_doctor.launch.plan import NodeFacts, build_launch_plan
from dflash_doctor.registry import run_checks
from tests.conftest import env_for
from tests.fakeenv import FakeSite
from tests.launch.test_launch_checks import h200
from tests.launch.test_train_gate import launches  # noqa: F401  (fixture)
from trainer.runspec.config import load_config
from trainer.runspec.target_shapes import target_hf_config

GB = 1000**3
QWEN = "qwen3-8b-b16"


def fake_free(by_folder: dict[str, int], default: int = 10_000 * GB) -> Callable[[str], tuple[int, int]]:
    """free_space() as if each folder named (and what is under it) were a file system with that many free
    bytes; everything else one big disk."""

    def free_space(path: str) -> tuple[int, int]:
        for number, (folder, free) in enumerate(by_folder.items(), start=1):
            if os.path.abspath(path).startswith(os.path.abspath(folder)):
                return number, free
        return 0, default

    return free_space


def disk_findings(site: FakeSite, tmp_path: Path, free: dict[str, int], facts: DiskFacts | None = None):
    cfg = load_config(QWEN, [f"output.dir={json.dumps(str(tmp_path / 'out'))}"])
    plan = build_launch_plan(
        cfg,
        Path(__file__),
        target_hf_config(cfg.target.path),
        "/fake/python",
        NodeFacts(2, disk=facts or DiskFacts()),
        store_dir=tmp_path / "home" / "snapshots",
    )
    ctx = CheckContext(env_for(site), CheckOptions(config=cfg))
    ctx.options.extra["launch_plan"] = plan
    ctx._shared["gpus"] = GpuInventory("580", 13000, [h200(0), h200(1)])
    return plan, {f.id: f for r in run_checks(ctx, ["launch"]) for f in r.findings if f.area == "launch"}


def test_a_qwen3_8b_launch_whose_output_folder_cannot_hold_a_checkpoint_is_refused(
    site: FakeSite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launch_checks, "free_space", fake_free({str(tmp_path / "out"): 10 * GB}))
    plan, got = disk_findings(site, tmp_path, {})
    full = got["launch.disk.full"]
    assert full.severity is Severity.FAIL
    assert (
        str(tmp_path / "out") in full.summary
        and "12.6 GB" in full.summary
        and "10.0 GB are free" in full.summary
    )
    assert "lower checkpoint.keep (each checkpoint is 12.6 GB)" in (full.remedy or "")
    checkpoints = next(w for w in plan.disk if w.what == "checkpoints")
    assert (
        checkpoints.bytes == checkpoint_bytes(plan.memory_inputs, plan.drafters) > 12 * GB
    )  # fp32 + AdamW, 1.05B params
    assert "launch.disk" not in got


def test_it_stays_quiet_when_the_run_fits(
    site: FakeSite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launch_checks, "free_space", fake_free({str(tmp_path / "out"): 500 * GB}))
    _, got = disk_findings(site, tmp_path, {})
    assert got["launch.disk"].severity is Severity.OK
    assert not [i for i in got if i.startswith("launch.disk.")]


def test_near_the_edge_warns(site: FakeSite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch_checks, "free_space", fake_free({str(tmp_path / "out"): 15 * GB}))
    _, got = disk_findings(site, tmp_path, {})
    assert got["launch.disk.tight"].severity is Severity.WARN  # 14.7 GB of 15: under 10% to spare


def test_a_store_that_cannot_hold_the_snapshot_warns_the_run_still_trains(
    site: FakeSite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    free = {str(tmp_path / "out"): 500 * GB, str(tmp_path / "home"): 10 * 1000**2}
    monkeypatch.setattr(launch_checks, "free_space", fake_free(free))
    _, got = disk_findings(site, tmp_path, {})
    store = got["launch.disk.store_full"]
    assert store.severity is Severity.WARN and "snapshot" in store.summary
    assert "cache prune" in (store.remedy or "")


def test_one_file_system_holds_the_output_and_the_store_together(
    site: FakeSite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The output's 14.7 GB fit 14.75 GB; with the snapshot's 160 MB on the same disk they do not."""
    monkeypatch.setattr(launch_checks, "free_space", fake_free({str(tmp_path): int(14.75 * GB)}))
    _, got = disk_findings(site, tmp_path, {})
    assert got["launch.disk.full"].severity is Severity.FAIL
    assert "compile-cache snapshot" in got["launch.disk.full"].summary


def test_checkpoints_already_there_count_towards_the_kept_ones() -> None:
    assert new_checkpoints_at_peak(keep=3, saves=10, existing=0) == 4  # 3 kept + the one being written
    assert new_checkpoints_at_peak(keep=3, saves=10, existing=1) == 3
    assert new_checkpoints_at_peak(keep=3, saves=10, existing=5) == 1  # resumed: one more beside them
    assert new_checkpoints_at_peak(keep=3, saves=2, existing=0) == 2  # the run saves only 2
    assert new_checkpoints_at_peak(keep=3, saves=None, existing=0) == 4  # epochs: the most it can be
    assert checkpoint_saves(300, 100) == 3 and checkpoint_saves(250, 100) == 3 and checkpoint_saves(7, 0) == 1


def test_the_gate_reads_the_node_facts_in_one_place(
    site: FakeSite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gate.node_facts: the GPUs the launch sees and the least free among them, the complete checkpoints
    already in the output folder (not a torn or temp one), the managed compile cache's bytes."""
    out, cache = tmp_path / "out", tmp_path / "inductor"
    for name, complete in (
        ("step_00000010", 1),
        ("step_00000020", 1),
        ("step_00000030", 0),
        (".tmp-step_40", 1),
    ):
        (out / "checkpoints" / name).mkdir(parents=True)
        if complete:
            (out / "checkpoints" / name / "state.pt").write_bytes(b"x")
    (cache / "triton").mkdir(parents=True)
    (cache / "triton" / "kernel.bin").write_bytes(b"k" * 1000)
    monkeypatch.setattr(gate, "managed_inductor_dir", lambda: cache)
    ctx = CheckContext(env_for(site))
    ctx._shared["gpus"] = GpuInventory("580", 13000, [h200(0, 100.0), h200(1, 60.0)])
    assert gate.node_facts(ctx, out) == NodeFacts(2, 60 * 1024**3, None, DiskFacts(2, 1000))
    ctx = CheckContext(env_for(site))
    ctx._shared["gpus"] = GpuUnavailable("no driver")
    assert gate.node_facts(ctx, tmp_path / "none") == NodeFacts(0, None, None, DiskFacts(0, 1000))


def test_the_dry_run_shows_the_sizes_and_refuses(
    launches: list[list[str]],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(gpus_module, "probe_gpus", lambda: GpuInventory("580", 13000, [h200(0), h200(1)]))
    monkeypatch.setattr(launch_checks, "free_space", fake_free({str(tmp_path / "runs"): 10 * GB}))
    assert run(["train", "--config", QWEN, "--no-deep", "--dry-run"]) == 1
    out = capsys.readouterr().out
    assert "launch.disk.full" in out
    plan_line = next(line for line in out.splitlines() if line.startswith("disk at the peak:"))
    assert "checkpoints 12.6 GB in " in plan_line and "export 2.1 GB in " in plan_line
    assert "compile-cache snapshot 160.0 MB in " in plan_line
    assert run(["train", "--config", QWEN, "--no-deep", "--dry-run", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert "launch.disk.full" in document["failing"]
    writes = {w["what"]: w for w in document["plan"]["disk"]}
    assert writes["checkpoints"]["bytes"] > 12 * GB and writes["export"]["bytes"] > 2 * GB
    assert launches == []
    monkeypatch.setattr(launch_checks, "free_space", fake_free({}))  # 10 TB free: no disk finding fails
    run(["train", "--config", QWEN, "--no-deep", "--dry-run", "--json"])
    document = json.loads(capsys.readouterr().out)
    assert not [f for f in document["failing"] if f.startswith("launch.disk")]
    assert any(f["id"] == "launch.disk" and f["severity"] == "ok" for f in document["findings"])
