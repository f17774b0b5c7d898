"""The memory plan's inputs by device: a CPU rank is planned with a process's overhead, not a CUDA context
(issue 18)."""

from __future__ import annotations

from dflash_doctor.launch.plan import plan_inputs
from trainer.runspec.config import load_config
from trainer.runspec.target_shapes import target_shapes


def test_a_cpu_rank_is_planned_without_a_cuda_context() -> None:
    cfg = load_config("tiny-cpu")
    shapes = target_shapes(cfg.target.path)
    cpu, gpu = plan_inputs(cfg, shapes, "cpu"), plan_inputs(cfg, shapes, "cuda")
    assert cpu.overhead_part == "process_overhead" and gpu.overhead_part == "cuda_context"
