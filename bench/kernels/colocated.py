"""Colocated: target capture and a drafter step in ONE process on ONE device, one after the other.

This is what a colocated trainer rank does (`topology.mode = "colocated"`; bench/suites/topology.sh measures the
real `dflash-doctor train` runs), and how earlier trainers run: each GPU holds the target and the drafter and alternates between them,
so each sample costs t_target + t_drafter. Our split runs the roles on different GPUs at the same time, so a
1+1 pair on 2 GPUs is bounded by max(t_target, t_drafter) per sample. Both come from the same run here:

  colocated       samples/s per GPU = batch / (t_target + t_drafter)   (measured as one loop iteration)
  2 x colocated   twice that: two independent colocated GPUs (an upper bound: no gradient sync counted)
  1+1 ideal       batch / max(t_target, t_drafter) on 2 GPUs (perfect overlap, zero transport cost);
                  `bench/e2e/e2e.py` measures the real 1+1 through the transport

Both roles are OUR code: `CaptureTarget` (truncated, hooks) feeding the trainer's `train_step` (fused AdamW,
compiled flex on CUDA) with the captured hidden states, as a drafter rank receives them.

    python3 -m bench.kernels.colocated --config qwen3-8b-b16 --config seed-b32
    .venv/bin/python -m bench.kernels.colocated --tiny                  # CPU dry run
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from bench.lib.roles import (
    RESULTS,
    DrafterRole,
    Recipe,
    describe_error,
    device_name,
    median,
    peak_gib,
    print_rows,
    random_ids,
    reset_peak,
    synchronize,
    time_repeats,
    write_result,
)
from trainer.model.batch import CapturedBatch
from trainer.model.device import target_dtype
from trainer.target_model.capture import CaptureTarget
from trainer.target_model.tiny import build_embedded_target

COLUMNS = ("recipe", "target_ms", "drafter_ms", "colocated_ms", "colocated_samples_s", "colocated_tok_s",
           "x2_colocated_tok_s", "ideal_1p1_tok_s", "ideal_vs_x2", "peak_gib")  # fmt: skip


def measure_recipe(
    recipe: Recipe, target: CaptureTarget, device: torch.device, warmup: int, repeats: int
) -> dict[str, Any]:
    role = DrafterRole.build(recipe, device)
    ids = random_ids(recipe, device, seed=5)
    loss_mask = torch.ones_like(ids, dtype=torch.bool)

    def handed_over() -> CapturedBatch:
        """Capture as a colocated trainer rank does: under no_grad (the target is built with
        inference_tensors=False), so the drafter trains on the states without a copy."""
        return target.capture(ids, loss_mask, 0)

    def iteration() -> None:
        role.step(handed_over())

    began = time.perf_counter()
    iteration()  # compiles the drafter's flex path at this recipe
    synchronize(device)
    first_s = time.perf_counter() - began
    reset_peak(device)
    colocated = median(time_repeats(iteration, device, max(0, warmup - 1), repeats))
    memory = peak_gib(device)
    batch = handed_over()
    target_s = median(time_repeats(lambda: target.capture(ids, loss_mask, 0), device, 1, repeats))
    drafter_s = median(time_repeats(lambda: role.step(batch), device, 1, repeats))

    tokens = recipe.batch * recipe.seq_len
    per_gpu = recipe.batch / colocated
    ideal = recipe.batch / max(target_s, drafter_s)
    return {
        "recipe": recipe.name,
        "shapes": recipe.shapes(),
        "first_iteration_s": round(first_s, 2),
        "target_ms": round(target_s * 1000, 2),
        "drafter_ms": round(drafter_s * 1000, 2),
        "colocated_ms": round(colocated * 1000, 2),
        "colocated_samples_s": round(per_gpu, 4),
        "colocated_tok_s": round(per_gpu * recipe.seq_len, 1),
        "x2_colocated_tok_s": round(2 * per_gpu * recipe.seq_len, 1),
        "ideal_1p1_samples_s": round(ideal, 4),
        "ideal_1p1_tok_s": round(ideal * tokens / recipe.batch, 1),
        "ideal_vs_x2": round(ideal / (2 * per_gpu), 3),
        "peak_gib": memory,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", action="append", help="trainer config (repeatable); default both recipes")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="section.key=value")
    parser.add_argument("--tiny", action="store_true", help="CPU dry run: the tiny target and drafter")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--out", type=Path, default=RESULTS / "colocated.json")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    configs = ["tiny-cpu"] if args.tiny else (args.config or ["qwen3-8b-b16", "seed-b32"])
    overrides = ["data.seq_len=256", "optim.anchors=16", *args.overrides] if args.tiny else args.overrides

    recipes = [Recipe.load(c, overrides, device) for c in configs]
    first = recipes[0].cfg
    if any(r.cfg.target != first.target or r.cfg.drafter.target_layer_ids != first.drafter.target_layer_ids
           for r in recipes):  # fmt: skip
        raise SystemExit("colocated.py: every recipe must share the target and its captured layers")
    began = time.perf_counter()
    model = build_embedded_target(
        first.target.path, first.run.seed, device, target_dtype(first.target.dtype, device)
    )
    compile_target = first.target.compile_layers and device.type == "cuda"  # as the trainer does
    # as a colocated trainer rank builds it (trainer.run.train.build_target): no inference tensors
    layers = list(first.drafter.target_layer_ids or [])
    target = CaptureTarget(model, layers, compile_target, inference_tensors=False)
    result: dict[str, Any] = {
        "device": device_name(device),
        "torch": torch.__version__,
        "target_build_s": round(time.perf_counter() - began, 2),
        "rows": [],
        "errors": [],
    }
    for recipe in recipes:
        try:
            result["rows"].append(measure_recipe(recipe, target, device, args.warmup, args.repeats))
        except Exception as exc:  # OOM or a compile failure at one recipe: keep the other
            result["errors"].append(describe_error(recipe.name, exc))
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        write_result(args.out, result)

    print_rows(
        f"colocated baseline: target + drafter in one process ({result['device']})", COLUMNS, result["rows"]
    )
    for error in result["errors"]:
        print(f"error: {error}")
    print(f"wrote {args.out}")
    return 0 if result["rows"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
