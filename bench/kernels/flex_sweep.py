"""flex_attention kernel options at a recipe's exact attention shapes: which tile configuration is fastest.

At the story's shapes (seed-b32) the flex kernels are more than half of the drafter step (backward 418 ms and
forward 145 ms of 1047 ms on an H200), so their tile configuration is the lever for drafter MFU. Each row
compiles the trainer's own `dflash_flex_attention` (fresh Dynamo state, `dynamic=False`) with one set of
`kernel_options` and times forward and backward separately with CUDA events, on the trainer's own block mask
(anchors from `sample_anchors`, mask from `dflash_block_mask`) and GQA layout (Hq x Q against Hkv x (S + Q)).

  default            Inductor's choice for this GPU (on sm90, bf16, d=128: forward 128x64 8 warps 3 stages,
                     backward M1/N1/M2/N2 64/128/128/64, 8 warps, 3 stages)
  rows safe          ROWS_GUARANTEED_SAFE (every query row sees at least its own block: skip the empty-row guard)
  TMA / prescale     USE_TMA, PRESCALE_QK
  pad kv             the context padded with masked keys to a multiple of 128, so S + Q divides the tile
                     (IS_DIVISIBLE: no bounds checks) and every block's own keys sit in one tile
  fwd ... / bwd ...  explicit tiles for one direction (`fwd_` / `bwd_` prefixed options)
  max-autotune       mode="max-autotune-no-cudagraphs" on this function alone: Inductor benchmarks its own
                     candidate list; its AUTOTUNE tables are kept in the JSON
  combined           the best forward tiles + the best backward tiles + every flag that helped by > 1%

Output must agree with the default row (bf16 tolerance), or the row is marked wrong. FLOPs count the mask's
real pairs (bench/lib/flops.py:attended_pairs): forward 2 matmuls, backward 5 (the recomputed QK^T included).

    python3 -m bench.kernels.flex_sweep --config seed-b32 --device cuda:0 --budget-s 400
    .venv/bin/python -m bench.kernels.flex_sweep --tiny                  # CPU dry run of the plumbing (no timing value)
"""

from __future__ import annotations

import argparse
import io
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bench.lib.attention_inputs import Inputs, timed_step
from bench.lib.flops import H200_BF16_PEAK_TFLOPS
from bench.lib.roles import RESULTS, Recipe, describe_error, device_name, median, print_rows, write_result
from trainer.model.attention import dflash_flex_attention


@dataclass(frozen=True)
class Row:
    name: str
    options: dict[str, Any] = field(default_factory=dict)
    pad_kv: bool = False
    mode: str | None = None


def _fwd(m: int, n: int, warps: int, stages: int) -> dict[str, int]:
    return {"fwd_BLOCK_M": m, "fwd_BLOCK_N": n, "fwd_num_warps": warps, "fwd_num_stages": stages}


def _bwd(m1: int, n1: int, m2: int, n2: int, warps: int, stages: int) -> dict[str, int]:
    return {"bwd_BLOCK_M1": m1, "bwd_BLOCK_N1": n1, "bwd_BLOCK_M2": m2, "bwd_BLOCK_N2": n2,
            "bwd_num_warps": warps, "bwd_num_stages": stages}  # fmt: skip


ROWS = (  # most telling first: a sweep cut short by its budget still answers the main questions
    Row("default"),
    Row("pad kv", pad_kv=True),
    Row("rows safe", {"ROWS_GUARANTEED_SAFE": True}),
    Row("bwd 64/64 w4 s3", _bwd(64, 64, 64, 64, 4, 3)),
    Row("bwd 64/128 w8 s2", _bwd(64, 128, 128, 64, 8, 2)),
    Row("bwd 64/128 w4 s3", _bwd(64, 128, 128, 64, 4, 3)),
    Row("bwd 32/128 w4 s3", _bwd(32, 128, 128, 32, 4, 3)),
    Row("bwd 64/64 w8 s4", _bwd(64, 64, 64, 64, 8, 4)),
    Row("fwd 128x128 w8 s2", _fwd(128, 128, 8, 2)),
    Row("fwd 128x64 w4 s3", _fwd(128, 64, 4, 3)),
    Row("fwd 128x128 w4 s3", _fwd(128, 128, 4, 3)),
    Row("fwd 64x128 w4 s3", _fwd(64, 128, 4, 3)),
    Row("TMA", {"USE_TMA": True}),
    Row("prescale", {"PRESCALE_QK": True}),
    Row("max-autotune", mode="max-autotune-no-cudagraphs"),  # after "combined" (it takes minutes)
)
FLAGS = ("ROWS_GUARANTEED_SAFE", "USE_TMA", "PRESCALE_QK")
COLUMNS = ("recipe", "row", "fwd_ms", "bwd_ms", "total_ms", "vs_default", "fwd_tflops", "bwd_tflops",
           "fwd_util", "bwd_util", "max_abs_diff", "compile_s")  # fmt: skip


class StderrTee(io.TextIOBase):
    """Inductor prints its AUTOTUNE tables with sys.stderr.write: keep a copy while still showing them."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.lines = inner, io.StringIO()

    def write(self, text: str) -> int:
        self.lines.write(text)
        return self.inner.write(text)

    def flush(self) -> None:
        self.inner.flush()


def autotune_tables(text: str) -> list[str]:
    """The AUTOTUNE blocks of Inductor's output: the header line and the ranked choices under it."""
    keep, inside = [], False
    for line in text.splitlines():
        if line.startswith("AUTOTUNE "):
            inside = True
        elif inside and not line.startswith(("  ", "strides", "dtypes", "AUTOTUNE")):
            inside = False
        if inside:
            keep.append(line.rstrip())
    return keep


def measure(row: Row, inputs: Inputs, device: torch.device, repeats: int) -> dict[str, Any]:
    """Compile `dflash_flex_attention` with this row's options, then time forward and backward apart."""
    torch._dynamo.reset()  # a fresh compile per row: options are constants baked into the graph
    compiled = torch.compile(dflash_flex_attention, dynamic=False, mode=row.mode)
    options = dict(row.options) or None

    def step() -> tuple[torch.Tensor, float, float]:
        return timed_step(
            lambda: compiled(inputs.q, inputs.k, inputs.v, inputs.block_mask, options), inputs, device
        )

    tee = StderrTee(sys.stderr)
    sys.stderr = tee
    began = time.perf_counter()
    try:
        out, _, _ = step()  # compiles forward and backward
    finally:
        sys.stderr = tee.inner
    compile_s = time.perf_counter() - began
    step()
    fwd, bwd = zip(*(step()[1:] for _ in range(repeats)), strict=True)
    result: dict[str, Any] = {
        "row": row.name,
        "options": row.options,
        "pad_kv": row.pad_kv,
        "mode": row.mode,
        "fwd_ms": round(median(list(fwd)) * 1e3, 3),
        "bwd_ms": round(median(list(bwd)) * 1e3, 3),
        "compile_s": round(compile_s, 1),
        "output": out,
    }
    result["total_ms"] = round(result["fwd_ms"] + result["bwd_ms"], 3)
    result["fwd_tflops"] = round(inputs.fwd_flops / (result["fwd_ms"] / 1e3) / 1e12, 1)
    result["bwd_tflops"] = round(inputs.bwd_flops / (result["bwd_ms"] / 1e3) / 1e12, 1)
    result["fwd_util"] = round(result["fwd_tflops"] / H200_BF16_PEAK_TFLOPS, 4)
    result["bwd_util"] = round(result["bwd_tflops"] / H200_BF16_PEAK_TFLOPS, 4)
    if row.mode:
        result["autotune"] = autotune_tables(tee.lines.getvalue())
    return result


def combined_row(rows: list[dict[str, Any]]) -> Row | None:
    """The fastest forward tiles, the fastest backward tiles, and the flags that each saved > 1%."""
    measured = [
        r for r in rows if "total_ms" in r and not r.get("wrong") and not r["mode"] and not r["pad_kv"]
    ]
    default = next((r for r in measured if r["row"] == "default"), None)
    if default is None:
        return None
    options: dict[str, Any] = {}
    best_fwd = min(measured, key=lambda r: r["fwd_ms"])
    best_bwd = min(measured, key=lambda r: r["bwd_ms"])
    options.update({k: v for k, v in best_fwd["options"].items() if k.startswith("fwd_")})
    options.update({k: v for k, v in best_bwd["options"].items() if k.startswith("bwd_")})
    for r in measured:
        flags = {k: v for k, v in r["options"].items() if k in FLAGS}
        if flags and r["total_ms"] < 0.99 * default["total_ms"]:
            options.update(flags)
    if not options or any(r["options"] == options for r in measured):
        return None
    pad = any(r["pad_kv"] and r.get("total_ms", math.inf) < 0.99 * default["total_ms"] for r in rows)
    return Row("combined", options, pad_kv=pad)


def run_recipe(
    recipe: Recipe, device: torch.device, rows: tuple[Row, ...], repeats: int, deadline: float, out: Path,
    header: dict[str, Any],
) -> list[dict[str, Any]]:  # fmt: skip
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    plain = Inputs(recipe, device, pad_kv=False, dtype=dtype)
    padded: Inputs | None = None
    results: list[dict[str, Any]] = []
    reference: torch.Tensor | None = None
    queue = list(rows)
    while queue:
        row = queue.pop(0)
        if time.monotonic() > deadline:
            results.append({"recipe": recipe.name, "row": row.name, "skipped": "budget spent"})
            continue
        if row.pad_kv and padded is None:
            padded = Inputs(recipe, device, pad_kv=True, dtype=dtype)
        inputs = padded if row.pad_kv and padded is not None else plain
        try:
            result = measure(row, inputs, device, repeats)
        except (
            Exception
        ) as exc:  # a tile that does not fit (shared memory) is a row, not the end of the sweep
            results.append({"recipe": recipe.name, "row": row.name, "options": row.options,
                            "error": describe_error(row.name, exc)})  # fmt: skip
            print(results[-1]["error"], file=sys.stderr)
            continue
        output = result.pop("output")
        if reference is None:
            reference = output
        diff = float((output.float() - reference.float()).abs().max())
        result.update(
            recipe=recipe.name, max_abs_diff=round(diff, 4), wrong=diff > 0.05 or not math.isfinite(diff)
        )
        results.append(result)
        default_ms = results[0].get("total_ms")
        for r in results:
            if "total_ms" in r and default_ms:
                r["vs_default"] = round(default_ms / r["total_ms"], 3)
        if row.name != "combined" and all(r.mode for r in queue):  # only autotune rows are left
            extra = combined_row(results)
            if extra is not None:
                queue.insert(0, extra)
        write_result(out, {**header, "recipe": recipe.shapes(), "density": round(plain.density, 4),
                           "kv_len": plain.kv_len, "rows": results})  # fmt: skip
    best = min(
        (r for r in results if "total_ms" in r and not r["wrong"]), key=lambda r: r["total_ms"], default=None
    )
    write_result(out, {**header, "recipe": recipe.shapes(), "density": round(plain.density, 4),
                       "kv_len": plain.kv_len, "rows": results, "best": best})  # fmt: skip
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config", default="seed-b32", help="a trainer config name or path (default seed-b32)"
    )
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=400.0, help="start no row after this many seconds")
    parser.add_argument("--row", action="append", help="only these rows (repeatable; default: all)")
    parser.add_argument("--tiny", action="store_true", help="CPU dry run at tiny shapes")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    tiny = args.tiny
    device = torch.device("cpu" if tiny else args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    overrides = ["data.seq_len=200", "optim.anchors=8", "drafter.block_size=4"] if tiny else []
    recipe = Recipe.load("tiny-cpu" if tiny else args.config, overrides, device)
    rows = tuple(r for r in ROWS if not args.row or r.name in args.row)
    if tiny:  # CPU flex has no backward tiles and no autotune: the plumbing only
        rows = tuple(r for r in rows if r.name in {"default", "pad kv"})
    out = args.out or RESULTS / f"flex_sweep-{recipe.name}.json"
    header = {"device": device_name(device), "torch": torch.__version__, "peak_tflops": H200_BF16_PEAK_TFLOPS}
    began = time.monotonic()
    results = run_recipe(recipe, device, rows, args.repeats, began + args.budget_s, out, header)
    print_rows(f"flex_attention kernel options at {recipe.name} ({device_name(device)})", COLUMNS, results)
    print(f"wrote {out}")
    return 0 if any("total_ms" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
