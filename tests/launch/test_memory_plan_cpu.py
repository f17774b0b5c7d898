"""The memory plan on a CPU (issue 39 U16): a colocated process's fixed cost counted once, and the CPU figure
marked a floor in the plan's output and JSON (a CPU run is eager and fp32, and its RSS keeps what the allocator
freed: smollm2-135m's plan said 5.1 GiB where 8.2 GB RSS was seen)."""

from __future__ import annotations

import json

from dflash_doctor.cli import run
from dflash_doctor.launch.memory_plan import colocated_estimate
from dflash_doctor.launch.plan import NodeFacts, build_launch_plan, plan_inputs
from tests.launch.test_train_gate import launches  # noqa: F401  (fixture)
from trainer.runspec.config import load_config
from trainer.runspec.config_file import resolve_config_path
from trainer.runspec.target_shapes import target_shapes


def test_a_colocated_cpu_process_pays_its_fixed_cost_once() -> None:
    cfg = load_config("tiny-cpu", ['topology.mode="colocated"'])
    inputs = plan_inputs(cfg, target_shapes(cfg.target.path), "cpu")
    parts = colocated_estimate(inputs).parts
    assert "cuda_context" not in parts  # was beside process_overhead: 0.5 GiB counted twice
    assert parts["process_overhead"] == inputs.cuda_context_bytes


def test_the_cpu_plan_is_marked_a_floor_and_the_gpu_plan_is_not() -> None:
    for name, gpus, floor in (("tiny-cpu", 0, True), ("qwen3-8b-b16", 1, False)):
        path = resolve_config_path(name)
        cfg = load_config(path)
        plan = build_launch_plan(
            cfg, path, target_shapes(cfg.target.path), "/py", NodeFacts(gpus), records=[]
        )
        assert plan.memory_is_floor is floor and plan.to_json()["memory_is_floor"] is floor


def test_dry_run_on_cpu_says_the_memory_figure_is_a_floor(launches, capsys) -> None:  # noqa: F811
    assert run(["train", "--config", "tiny-cpu", "--no-deep", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert ">= " in out and "GiB" in out  # the table's peak column
    assert "memory: a floor on CPU" in out
    assert run(["train", "--config", "tiny-cpu", "--no-deep", "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["memory_is_floor"] is True
