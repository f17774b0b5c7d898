"""`[profile]`: a torch.profiler window over a few training steps, and how busy the GPU was in it.

Off by default (`profile.steps = 0`). With `profile.start = S` and `profile.steps = K`, every rank records
steps S .. S+K-1 (1-based, as the metrics count them) with CPU and CUDA activity and writes, under
`<output.dir>/profile/`:

  rank<R>.trace.json     a Chrome trace (chrome://tracing, https://ui.perfetto.dev)
  rank<R>.summary.json   the window's wall time, the GPU's busy time (kernels and copies, overlaps merged)
                         and busy share, its time per step by kernel kind (GEMM, flex attention, the loss,
                         Triton elementwise, ...), the ten most expensive GPU kernels and CPU operations

The busy share answers the question a throughput gap asks first: is the GPU idle between kernels (the host
is late: syncs, launches, Python) or busy the whole time (the kernels themselves are the cost)?
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from dflash_base.atomic import write_json_atomic
from trainer.runspec.config import ProfileSection


def merged_busy_us(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals (microseconds in, microseconds out)."""
    busy, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None and current_start is not None:
                busy += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None and current_start is not None:
        busy += current_end - current_start
    return busy


class StepProfiler:
    """Profile steps [start, start + steps) of this rank; a no-op when `steps` is 0."""

    def __init__(self, section: ProfileSection, output_dir: Path, rank: int, device: torch.device) -> None:
        self.first, self.last = section.start, section.start + section.steps - 1
        self.enabled = section.steps > 0
        self.folder, self.rank, self.device = output_dir / "profile", rank, device
        self.profiler: Any = None
        self.began = 0.0

    def before(self, step: int) -> None:
        """Called before step `step` (1-based) is queued."""
        if not self.enabled or step != self.first:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(activities=activities, record_shapes=False)
        self.profiler.__enter__()
        self.began = time.perf_counter()

    def after(self, step: int) -> None:
        """Called after step `step` is queued: the window closes after its last step's work has run."""
        if self.profiler is None or step != self.last:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        wall_s = time.perf_counter() - self.began
        profiler, self.profiler = self.profiler, None
        profiler.__exit__(None, None, None)
        busy = self.write(profiler, wall_s)["gpu_busy_share"]
        busy_text = (
            f"GPU busy {busy:.1%} of {wall_s:.2f} s" if busy is not None else f"{wall_s:.2f} s (no GPU)"
        )
        print(
            f"dflash trainer: rank {self.rank} profiled steps {self.first}-{self.last}: {busy_text}; "
            f"{self.summary_path} and rank{self.rank}.trace.json beside it",
            flush=True,
        )

    def write(self, profiler: Any, wall_s: float) -> dict[str, Any]:
        """The trace and the summary (written atomically); returns the summary."""
        self.folder.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(self.folder / f"rank{self.rank}.trace.json"))
        summary = summarize(profiler, wall_s, self.first, self.last)
        write_json_atomic(self.summary_path, summary)
        return summary

    @property
    def summary_path(self) -> Path:
        return self.folder / f"rank{self.rank}.summary.json"


# What a GPU kernel is, from its name (cuBLAS, Triton and flex attention name theirs this way): a step's GPU time
# by kind says where a faster kernel would pay. The SmolLM2 recipe on an H200 (BENCHMARKS 5.12): GEMMs 43%,
# Triton elementwise and norms 20%, the loss's logsumexp over the vocabulary 14%, flex attention backward 10%.
KERNEL_KINDS = (
    ("flex attention backward", ("flex_attention_backward",)),
    ("flex attention forward", ("flex_attention", "flex_decoding")),
    ("loss over the vocabulary", ("logsumexp",)),
    ("GEMM", ("nvjet", "gemm", "cutlass", "splitkreduce", "matmul")),
    ("attention (SDPA)", ("sdpa", "flash", "fmha")),
    ("optimizer", ("adam", "multi_tensor")),
    ("copies and fills", ("memcpy", "memset")),
    ("Triton elementwise and reductions", ("triton_",)),
)


def kernel_kind(name: str) -> str:
    """The kind of a GPU kernel by its name; "other" when no known spelling matches."""
    lowered = name.lower()
    for kind, spellings in KERNEL_KINDS:
        if any(s in lowered for s in spellings):
            return kind
    return "other"


def summarize(profiler: Any, wall_s: float, first: int, last: int) -> dict[str, Any]:
    """The window in numbers: wall, GPU busy time and share, GPU time by kernel kind (per step), the top GPU
    kernels (by summed time: each kernel counted once, however many ops launched it) and CPU operations."""
    gpu_intervals: list[tuple[float, float]] = []
    kernels: dict[str, list[float]] = {}  # name -> [microseconds, calls]
    for event in profiler.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.time_range.elapsed_us() > 0:
            gpu_intervals.append((event.time_range.start, event.time_range.end))
            seen = kernels.setdefault(event.name, [0.0, 0])
            seen[0] += event.time_range.elapsed_us()
            seen[1] += 1
    busy_s = merged_busy_us(gpu_intervals) / 1e6
    steps = max(last - first + 1, 1)
    averages = profiler.key_averages()

    def top_cpu() -> list[dict[str, Any]]:
        rows = sorted(averages, key=lambda e: getattr(e, "self_cpu_time_total", 0.0), reverse=True)[:10]
        return [
            {"name": e.key[:120], "self_ms": round(e.self_cpu_time_total / 1000, 3), "calls": e.count}
            for e in rows
            if getattr(e, "self_cpu_time_total", 0.0) > 0
        ]

    by_kind: dict[str, float] = {}
    for name, (us, _) in kernels.items():
        kind = kernel_kind(name)
        by_kind[kind] = by_kind.get(kind, 0.0) + us
    total_us = sum(by_kind.values())
    return {
        "steps": [first, last],
        "wall_s": round(wall_s, 4),
        "gpu_busy_s": round(busy_s, 4),
        "gpu_busy_share": round(busy_s / wall_s, 4) if gpu_intervals and wall_s > 0 else None,
        "gpu_ms_per_step_by_kind": {
            kind: {"ms_per_step": round(us / steps / 1000, 3), "share": round(us / total_us, 4)}
            for kind, us in sorted(by_kind.items(), key=lambda kv: -kv[1])
        },
        "top_gpu": [
            {"name": name[:120], "ms": round(us / 1000, 3), "calls": int(calls), "kind": kernel_kind(name)}
            for name, (us, calls) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:10]
        ],
        "top_cpu": top_cpu(),
    }
