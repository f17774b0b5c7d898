"""`[profile]`: off by default; a window of steps traced, summarised and written per rank; bad windows refused."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dflash_base.errors import ConfigError
from tests.trainer.trainer_runs import torchrun
from trainer.run.profiling import kernel_kind, merged_busy_us, summarize
from trainer.runspec.config import load_config

COLOCATED = {"topology.mode": '"colocated"'}


def test_overlapping_kernels_count_once_and_gaps_not_at_all() -> None:
    assert merged_busy_us([]) == 0.0
    assert merged_busy_us([(0, 10), (5, 15), (20, 30)]) == 25.0  # 0-15 and 20-30
    assert merged_busy_us([(20, 30), (0, 10), (10, 12)]) == 22.0  # touching intervals join
    assert merged_busy_us([(0, 100), (10, 20), (30, 40)]) == 100.0  # nested ones add nothing


def test_kernels_are_sorted_into_kinds_and_each_counted_once_per_launch() -> None:
    assert kernel_kind("nvjet_sm90_tst_192x192_64x3_1x2_h_bz_coopB_NNN") == "GEMM"
    assert (
        kernel_kind("triton_tem_fused_flex_attention_backward_transpose_view_5") == "flex attention backward"
    )
    assert (
        kernel_kind("triton_red_fused__to_copy_arange_argmax_eq_exp_logsumexp_mul_sub_0")
        == "loss over the vocabulary"
    )
    assert kernel_kind("triton_poi_fused_add_mul_rsqrt_7") == "Triton elementwise and reductions"
    assert kernel_kind("cudnn_generated_fort_native_sdpa_sm90_flash_fprop") == "attention (SDPA)"
    assert kernel_kind("some_vendor_kernel") == "other"

    def kernel(name: str, start: float, end: float) -> SimpleNamespace:
        elapsed = end - start
        span = SimpleNamespace(start=start, end=end, elapsed_us=lambda: elapsed)
        return SimpleNamespace(name=name, device_type=torch.autograd.DeviceType.CUDA, time_range=span)

    events = [
        kernel("nvjet_a", 0, 6000),
        kernel("nvjet_a", 6000, 12000),
        kernel("triton_poi_fused_x", 12000, 14000),
    ]
    profiler = SimpleNamespace(events=lambda: events, key_averages=lambda: [])
    summary = summarize(profiler, wall_s=0.02, first=3, last=4)
    assert summary["gpu_busy_s"] == 0.014 and summary["gpu_busy_share"] == 0.7
    assert summary["gpu_ms_per_step_by_kind"] == {
        "GEMM": {"ms_per_step": 6.0, "share": 0.8571},
        "Triton elementwise and reductions": {"ms_per_step": 1.0, "share": 0.1429},
    }
    assert summary["top_gpu"][0] == {"name": "nvjet_a", "ms": 12.0, "calls": 2, "kind": "GEMM"}
    assert len(summary["top_gpu"]) == 2  # one row a kernel, never listed twice


def test_profiling_is_off_by_default_and_a_window_past_the_last_step_is_refused() -> None:
    cfg = load_config("configs/tiny-cpu.toml")
    assert cfg.profile.steps == 0
    with pytest.raises(ConfigError, match=r"profile\.start: steps 299-301 do not all run"):
        load_config("configs/tiny-cpu.toml", ["profile.start=299", "profile.steps=3"])
    with pytest.raises(ConfigError, match=r"profile\.steps"):
        load_config("configs/tiny-cpu.toml", ["profile.steps=-1"])


def test_a_profiled_window_writes_a_trace_and_a_summary(tmp_path: Path) -> None:
    run = torchrun(
        "configs/tiny-cpu.toml",
        tmp_path / "out",
        nproc=1,
        overrides={
            **COLOCATED,
            "optim.steps": "6",
            "checkpoint.every": "0",
            "profile.start": "3",
            "profile.steps": "2",
        },
    )
    assert run.returncode == 0, run.stderr[-3000:]
    folder = run.out_dir / "profile"
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.summary.json", "rank0.trace.json"]
    summary = json.loads((folder / "rank0.summary.json").read_text())
    assert summary["steps"] == [3, 4] and summary["wall_s"] > 0
    assert summary["gpu_busy_share"] is None  # CPU: no kernels to be busy with
    assert summary["top_cpu"] and all(row["self_ms"] > 0 for row in summary["top_cpu"])
    assert "traceEvents" in json.loads((folder / "rank0.trace.json").read_text())
    assert [m["step"] for m in run.metrics] == list(range(1, 7))  # the window changes nothing else
    assert "rank 0 profiled steps 3-4: " in run.stdout + run.stderr


def test_without_a_window_nothing_is_written(tmp_path: Path) -> None:
    run = torchrun(
        "configs/tiny-cpu.toml",
        tmp_path / "out",
        nproc=1,
        overrides={**COLOCATED, "optim.steps": "3", "checkpoint.every": "0"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert not (run.out_dir / "profile").exists()
