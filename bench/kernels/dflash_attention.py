"""The DFlash-mask Triton kernel against the trainer's compiled flex path, at a recipe's exact attention shapes.

Issue 40 §3: at qwen3-8b-b16 the flex backward is ~16.5 ms a step at 124 TFLOP/s, 16% of an H200's peak
(BENCHMARKS.md 3.3, 4.0), and flex's tile options do not help. bench/kernels/dflash_mask_kernel.py (out of the trainer: nothing shipped calls it) walks the mask's
structure instead; this script decides whether it earns a place as an opt-in: forward and backward timed
apart (CUDA events, the median of --repeats after --warmup untimed calls), TFLOP/s from the mask's real
pairs (bench/lib/flops.py:attended_pairs; forward 2 matmuls, backward 5 with the recomputed QK^T, as
flex_sweep counts), the share of the measured H200 bf16 peak (790 TFLOP/s, `util`) and of the 989 TFLOP/s
datasheet dense peak (`util_spec`). One call is one drafter layer: BENCHMARKS.md 4.0's 16.5 ms of flex backward
a b16 step is 5 calls, and counts the backward as 4 matmuls, not 5. Both kernels run on the same tensors: the trainer's anchors, block mask
and padded key layout (flex_context_len), with the recipe's flex_kernel_options for flex.

Each Triton row must match flex (the reference row) to 1e-2 relative in bf16, output and q/k/v gradients
(max |a - b| <= 1e-2 max |b|, per tensor), or it is marked wrong. The Triton rows sweep a few tile sets
(`TILE_ROWS`): the default compiles for sm90 without register spills; the others trade spills for tile size.

On an H200 (the suite runs b16 and b32, ~3 minutes):
    python3 -m bench.kernels.dflash_attention --config qwen3-8b-b16 --device cuda:0
    python3 -m bench.kernels.dflash_attention --config seed-b32 --device cuda:0
    run(kind="nvidia-h200", carry=[".whl"], timeout_s=300, command="bash bench/suites/dflash_kernel_h200.sh")
CPU dry run of the plumbing (Triton's interpreter, SDPA as the reference, tiny shapes; no timing value):
    .venv/bin/python -m bench.kernels.dflash_attention --device cpu --tiny
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

if "--tiny" in sys.argv:  # CPU: Triton's interpreter, which must be on before anything imports triton
    os.environ["TRITON_INTERPRET"] = "1"

import torch

from bench.lib.attention_inputs import Inputs, timed_step
from bench.lib.flops import H200_BF16_PEAK_TFLOPS
from bench.lib.roles import RESULTS, Recipe, describe_error, device_name, median, print_rows, write_result
from trainer.model.attention import dense_mask, dflash_flex_attention, sdpa_attention

SPEC_PEAK_TFLOPS = 989.0  # H200 SXM datasheet, dense bf16: the "50% of peak" may mean either
TOLERANCE = 1e-2  # relative, bf16 (issue 40 §3)
COLUMNS = ("recipe", "row", "fwd_ms", "bwd_ms", "total_ms", "bwd_vs_flex", "fwd_tflops", "bwd_tflops",
           "fwd_util", "bwd_util", "bwd_util_spec", "worst_rel_err", "wrong")  # fmt: skip


def tile_rows() -> dict[str, Any]:
    """The Triton rows: name -> Tiles. Imported late: TRITON_INTERPRET must be set before triton is."""
    from bench.kernels.dflash_mask_kernel import GPU_TILES, INTERPRETER_TILES, interpreted

    if interpreted():
        return {"triton": INTERPRETER_TILES}
    return {  # ptxas -v spill bytes (sm90, bf16, d 128) in each comment: fwd / dq / dkdv context, block
        "triton": GPU_TILES,  # 0 / 0 / 16, 100
        "triton fwd 128x128": GPU_TILES.__class__(**{**asdict(GPU_TILES), "fwd_n": 128}),  # 60 / - / -
        "triton dkdv 64x128": GPU_TILES.__class__(**{**asdict(GPU_TILES), "bwd_n": 128}),  # - / - / 316, 788
        "triton dq 128x64": GPU_TILES.__class__(**{**asdict(GPU_TILES), "dq_n": 64}),  # - / 36 / -
    }


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """max |got - expected| over max |expected|: one number per tensor, meaningful where entries are ~0."""
    scale = float(expected.float().abs().max())
    return float((got.float() - expected.float()).abs().max()) / max(scale, 1e-12)


def reference_fn(inputs: Inputs, device: torch.device, options: dict[str, Any] | None) -> tuple[str, Any]:
    """The row every other row is held to: compiled flex on CUDA (the trainer's path), exact SDPA on CPU
    (CPU flex has no backward)."""
    if device.type == "cuda":
        compiled = torch.compile(dflash_flex_attention, dynamic=False)
        return "flex", lambda: compiled(inputs.q, inputs.k, inputs.v, inputs.block_mask, options)
    num_anchors = inputs.context_end.shape[1]
    block = inputs.q.shape[2] // num_anchors
    anchors = inputs.context_end  # context ends as anchors, all valid: the same mask
    mask = dense_mask(anchors, torch.ones_like(anchors, dtype=torch.bool), inputs.context_len, block)
    return "sdpa (exact)", lambda: sdpa_attention(inputs.q, inputs.k, inputs.v, mask)


def measure(
    name: str, forward: Any, inputs: Inputs, device: torch.device, warmup: int, repeats: int
) -> tuple[dict[str, Any], tuple[torch.Tensor, ...]]:
    """Time one row; return its figures and (output, dq, dk, dv) of its first call."""
    out, _, _ = timed_step(forward, inputs, device)  # compiles (flex) or JITs (Triton)
    grads = tuple(t.grad.detach().clone() for t in (inputs.q, inputs.k, inputs.v))  # type: ignore[union-attr]
    for _ in range(warmup):
        timed_step(forward, inputs, device)
    fwd, bwd = zip(*(timed_step(forward, inputs, device)[1:] for _ in range(repeats)), strict=True)
    row: dict[str, Any] = {"row": name, "fwd_ms": round(median(list(fwd)) * 1e3, 3),
                           "bwd_ms": round(median(list(bwd)) * 1e3, 3)}  # fmt: skip
    row["total_ms"] = round(row["fwd_ms"] + row["bwd_ms"], 3)
    for part, flops in (("fwd", inputs.fwd_flops), ("bwd", inputs.bwd_flops)):
        tflops = flops / (row[f"{part}_ms"] / 1e3) / 1e12
        row[f"{part}_tflops"] = round(tflops, 1)
        row[f"{part}_util"] = round(tflops / H200_BF16_PEAK_TFLOPS, 4)
        row[f"{part}_util_spec"] = round(tflops / SPEC_PEAK_TFLOPS, 4)
    return row, (out, *grads)


def run_recipe(recipe: Recipe, device: torch.device, warmup: int, repeats: int) -> dict[str, Any]:
    from bench.kernels.dflash_mask_kernel import dflash_attention

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    inputs = Inputs(recipe, device, pad_kv=True, dtype=dtype, backward=True)
    block = recipe.cfg.drafter.block_size
    options = dict(recipe.cfg.drafter.flex_kernel_options) or None
    ref_name, ref_fn = reference_fn(inputs, device, options)
    rows: list[dict[str, Any]] = []
    reference, ref_values = measure(ref_name, ref_fn, inputs, device, warmup, repeats)
    rows.append({"recipe": recipe.name, **reference})
    for name, tiles in tile_rows().items():

        def forward(tiles: Any = tiles) -> torch.Tensor:
            return dflash_attention(
                inputs.q, inputs.k, inputs.v, inputs.context_end, inputs.context_len, block, tiles=tiles
            )

        try:
            row, values = measure(name, forward, inputs, device, warmup, repeats)
        except Exception as exc:  # a tile set that does not fit (shared memory) is a row, not the end
            rows.append({"recipe": recipe.name, "row": name, "error": describe_error(name, exc)})
            print(rows[-1]["error"], file=sys.stderr)
            continue
        errors = {part: round(relative_error(got, want), 5)
                  for part, got, want in zip(("out", "dq", "dk", "dv"), values, ref_values, strict=True)}  # fmt: skip
        worst = max(errors.values())
        row.update(recipe=recipe.name, tiles=asdict(tiles), rel_err=errors, worst_rel_err=worst,
                   wrong=not worst <= TOLERANCE, bwd_vs_flex=round(reference["bwd_ms"] / row["bwd_ms"], 3))  # fmt: skip
        rows.append(row)
    valid = [r for r in rows[1:] if "total_ms" in r and not r["wrong"]]
    best = min(valid, key=lambda r: r["bwd_ms"], default=None)
    return {
        "recipe": recipe.shapes(), "reference": ref_name, "density": round(inputs.density, 4),
        "context_len": inputs.context_len, "kv_len": inputs.kv_len, "rows": rows, "best": best,
        "saved_ms_per_layer": round(reference["total_ms"] - best["total_ms"], 3) if best else None,
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="qwen3-8b-b16", help="a trainer config name or path")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tiny", action="store_true", help="CPU dry run: tiny shapes, Triton's interpreter")
    parser.add_argument(
        "--json", type=Path, default=None, help="default bench/results/dflash_attention-<config>.json"
    )
    args = parser.parse_args()

    device = torch.device("cpu" if args.tiny else args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif not args.tiny:
        parser.error("off CUDA the kernels run in Triton's interpreter: only with --tiny")
    overrides = ["data.seq_len=50", "optim.anchors=4", "drafter.block_size=4"] if args.tiny else []
    recipe = Recipe.load("tiny-cpu" if args.tiny else args.config, overrides, device)
    out = args.json or RESULTS / f"dflash_attention-{recipe.name}.json"
    result = {"device": device_name(device), "torch": torch.__version__, "peak_tflops": H200_BF16_PEAK_TFLOPS,
              "spec_peak_tflops": SPEC_PEAK_TFLOPS, "tolerance": TOLERANCE,
              **run_recipe(recipe, device, args.warmup, 1 if args.tiny else args.repeats)}  # fmt: skip
    write_result(out, result)
    print_rows(f"DFlash-mask Triton kernel vs {result['reference']} at {recipe.name} ({device_name(device)})",
               COLUMNS, result["rows"])  # fmt: skip
    print(f"density {result['density']}, best {result['best'] and result['best']['row']}, "
          f"saved {result['saved_ms_per_layer']} ms a layer; wrote {out}")  # fmt: skip
    return 0 if result["best"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
