"""Drafter step variants at each recipe's shapes: find the bottleneck, measure each predicted effect.

Every row is the REAL drafter (`trainer.run.warmup.build_drafter`) stepped by the REAL `trainer.run.train.train_step`
(anchors, bf16 autocast, forward, backward, grad clip, AdamW, schedule); a variant only sets config values
or patches from here (nothing under trainer/ is edited). Rows, each against the first ("trainer"), same run:

  trainer          what a drafter rank runs today (config defaults): compiled decoder layers (flex traced
                   inline), the LM head + CE chunk compiled with its gradient computed in the forward pass,
                   frozen embed/head in bf16, fused AdamW; profiled (top kernels in the JSON)
  eager layers     drafter.compile_layers = false (flex and the block mask still compiled on their own)
  recompute head   the LM head + CE under activation checkpointing instead (the logits recomputed in
                   backward: what the trainer did before)
  last session     eager layers + recompute head: the trainer as measured in the previous session
  eager loss       drafter.compile_loss = false
  chunk N          drafter.loss_chunk = N rows per LM-head chunk
  flex TMA         drafter.flex_kernel_options = {USE_TMA = true} (flex_attention's USE_TMA kernel option)
  unpadded kv      the flex keys laid out [context S | blocks] as before `flex_context_len` padded S to 128
  flex fwd ...     forward-kernel options from bench/kernels/flex_sweep.py (`fwd_` prefixed: the backward is untouched)
  max-autotune     drafter.compile_mode = "max-autotune-no-cudagraphs" for the layers

Each variant starts from the same seeded init, batch and anchors, so `first_loss` must agree across rows
(bf16 tolerance): a variant that changes the numbers is wrong, not fast. FLOPs and MFU: bench/lib/flops.py.

    python3 -m bench.kernels.drafter_variants --config qwen3-8b-b16 --config seed-b32 --budget-s 200
    .venv/bin/python -m bench.kernels.drafter_variants --tiny          # CPU dry run (SDPA, small shapes)
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

import trainer.model.drafter
import trainer.model.loss
from bench.lib.flops import H200_BF16_PEAK_TFLOPS
from bench.lib.roles import (
    RESULTS,
    DrafterRole,
    Recipe,
    describe_error,
    device_name,
    drafter_step_flops,
    frozen_weights,
    median,
    peak_gib,
    print_rows,
    random_batch,
    reset_peak,
    synchronize,
    time_repeats,
    write_result,
)
from trainer.runspec.config import load_config


@dataclass(frozen=True)
class Variant:
    name: str
    prediction: str
    sets: tuple[str, ...] = ()  # config overrides (section.key=value)
    recompute_head: bool = False
    unpadded_kv: bool = (
        False  # the flex context laid out unpadded (before trainer.model.attention.flex_context_len)
    )
    profile: bool = False


VARIANTS = (
    Variant("trainer", "the baseline", profile=True),
    Variant(
        "eager layers",
        "fp32 RMSNorm/RoPE/SwiGLU/residual traffic unfused (~35 ms of elementwise passes at b16): 15-20% slower",
        sets=("drafter.compile_layers=false",),
    ),
    Variant(
        "recompute head",
        "a third pass of the head matmul (9.6 of 72.5 TFLOP at b16): 8-10% slower",
        recompute_head=True,
    ),
    Variant(
        "last session",
        "both of the above: ~195 ms at b16 (46.6% MFU measured then)",
        sets=("drafter.compile_layers=false",), recompute_head=True,
    ),
    Variant(
        "eager loss",
        "fp32 logits materialised, softmax/CE/grad in separate passes over (chunk, vocab): 3-6% slower",
        sets=("drafter.compile_loss=false",),
    ),
    Variant("chunk 4096", "half the chunk loops, +1.2 GB: within 1-2%", sets=("drafter.loss_chunk=4096",)),
    Variant(
        "flex TMA",
        "TMA loads in the flex kernels: attention is ~55% of the b32 step's kernel time; 0-10% faster",
        sets=("drafter.flex_kernel_options={USE_TMA=true}",),
    ),
    Variant(
        "unpadded kv",
        "S + Q not a tile multiple at b32 (40000 + 32768): flex_sweep 1.09x slower flex, ~40 ms (4%) of the step; "
        "b16 unchanged (3072 is a multiple of 128)",
        unpadded_kv=True,
    ),
    Variant(
        "flex fwd TMA",
        "TMA in the forward kernel only: flex_sweep forward 28.0 -> 25.0 ms per layer at b32, backward as is: "
        "~1.5% faster at b32",
        sets=("drafter.flex_kernel_options={fwd_USE_TMA=true}",),
    ),
    Variant(
        "flex fwd 64x64",
        "max-autotune's forward pick (64x64 tiles, 4 warps, 3 stages): 28.0 -> 26.2 ms per layer at b32: ~1% faster",
        sets=("drafter.flex_kernel_options={fwd_BLOCK_M=64, fwd_BLOCK_N=64, fwd_num_warps=4, fwd_num_stages=3}",),
    ),
    Variant(
        "max-autotune",
        "autotuned flex/pointwise/matmul kernels in the layer graphs: 5-15% faster at b32, minutes more compile",
        sets=('drafter.compile_mode="max-autotune-no-cudagraphs"',),
    ),
)  # fmt: skip

COLUMNS = ("recipe", "variant", "step_ms", "vs_trainer", "samples_s", "tok_s", "tflops", "mfu", "peak_gib",
           "first_step_s", "first_loss")  # fmt: skip


def checkpointed_head_ce(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    chunk: int,
    compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The previous `trainer.model.loss.chunked_weighted_ce`: each chunk under activation checkpointing, so
    backward recomputes the chunk's logits before it can form their gradient."""
    from torch.utils.checkpoint import checkpoint

    fn = (
        trainer.model.loss.compiled_chunk(trainer.model.loss._head_and_ce)
        if compiled
        else trainer.model.loss._head_and_ce
    )
    step = trainer.model.loss.even_chunk(hidden.shape[0], chunk) if compiled else chunk
    total, correct = hidden.new_zeros((), dtype=torch.float32), []
    for start in range(0, hidden.shape[0], step):
        rows = slice(start, start + step)
        part, part_correct = checkpoint(
            fn, hidden[rows], lm_head_weight, labels[rows], weights[rows], use_reentrant=False
        )
        total, correct = total + part, [*correct, part_correct]
    return total, torch.cat(correct)


@contextmanager
def unpadded_flex_context(unpadded: bool) -> Iterator[None]:
    """Lay the flex keys out as before the padding: the drafter looks `flex_context_len` up at call time."""
    original = trainer.model.drafter.flex_context_len
    if unpadded:
        trainer.model.drafter.flex_context_len = lambda seq_len: seq_len
    try:
        yield
    finally:
        trainer.model.drafter.flex_context_len = original


@contextmanager
def head_ce(recompute: bool) -> Iterator[None]:
    """Swap trainer.model.loss's chunked head + CE (looked up at call time) for the checkpointed one, then restore."""
    original = trainer.model.loss.chunked_weighted_ce
    if recompute:
        trainer.model.loss.chunked_weighted_ce = checkpointed_head_ce
    try:
        yield
    finally:
        trainer.model.loss.chunked_weighted_ce = original


def top_kernels(role: DrafterRole, batch: Any, count: int = 10) -> list[dict[str, Any]]:
    """One profiled step: the `count` kernels (CUDA) or ops (CPU) with the most self time, and their
    share of all kernel time in the step."""
    from torch.profiler import ProfilerActivity, profile

    cuda = role.device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        role.step(batch)
        synchronize(role.device)

    def self_us(event: Any) -> float:
        if not cuda:
            return float(event.self_cpu_time_total)
        return float(
            getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0)
        )

    from torch.autograd import DeviceType

    # On CUDA only the kernels themselves: a CPU op's "self device time" is its kernels' time again.
    events = [
        e
        for e in prof.key_averages()
        if self_us(e) > 0 and (not cuda or getattr(e, "device_type", None) == DeviceType.CUDA)
    ]
    total = sum(self_us(e) for e in events) or 1.0
    events.sort(key=self_us, reverse=True)
    return [
        {
            "name": e.key[:160],
            "calls": int(e.count),
            "ms": round(self_us(e) / 1000, 3),
            "share": round(self_us(e) / total, 4),
        }
        for e in events[:count]
    ]


def run_variant(
    base: Recipe,
    variant: Variant,
    frozen: tuple[torch.Tensor, torch.Tensor],
    device: torch.device,
    warmup: int,
    repeats: int,
    peak_tflops: float,
) -> dict[str, Any]:
    overrides = (*base.overrides, *variant.sets)
    recipe = Recipe(
        base.name, load_config(base.source, list(overrides)), base.hf_config, base.source, overrides
    )
    torch._dynamo.reset()  # each row compiles (or loads from the on-disk cache) as a fresh process would
    role = DrafterRole.build(recipe, device, frozen=frozen)
    batch = random_batch(recipe, role.model, device, seed=11)
    with head_ce(variant.recompute_head), unpadded_flex_context(variant.unpadded_kv):
        began = time.perf_counter()
        first_loss = role.step(batch)  # compiles what this variant compiles
        synchronize(device)
        first_step_s = time.perf_counter() - began
        reset_peak(device)
        seconds = median(time_repeats(lambda: role.step(batch), device, max(0, warmup - 1), repeats))
        memory = peak_gib(device)
        kernels = top_kernels(role, batch) if variant.profile else None
    flops, density = drafter_step_flops(recipe, role.model, device)
    row = {
        "recipe": recipe.name,
        "variant": variant.name,
        "step_ms": round(seconds * 1000, 2),
        "samples_s": round(recipe.batch / seconds, 4),
        "tok_s": round(recipe.batch * recipe.seq_len / seconds, 1),
        "tflop_per_step": round(flops / 1e12, 3),
        "tflops": round(flops / seconds / 1e12, 2),
        "mfu": round(flops / seconds / 1e12 / peak_tflops, 4),
        "mask_density": round(density, 4),
        "peak_gib": memory,
        "first_step_s": round(first_step_s, 2),
        "first_loss": round(first_loss, 5),
        "loss_finite": math.isfinite(first_loss),
        "attention": role.model.attention,
        "loss_chunk": role.model.loss_chunk,
        "compiled_layers": role.model.layers_compiled,
        "setup": asdict(variant),
    }
    if kernels is not None:
        row["top_kernels"] = kernels
    return row


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", action="append", help="trainer config (repeatable); default both recipes")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="section.key=value")
    parser.add_argument("--variant", action="append", help="only these variants (repeatable)")
    parser.add_argument("--tiny", action="store_true", help="CPU dry run: tiny-cpu at small shapes, SDPA")
    parser.add_argument("--device", default=None, help="cuda:N (default: cuda, or cpu with --tiny)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=float("inf"), help="skip variants past this time")
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_PEAK_TFLOPS)
    parser.add_argument("--out", type=Path, default=RESULTS / "drafter_variants.json")
    args = parser.parse_args()

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.tiny else "cpu"))
    if device.type == "cuda":
        torch.cuda.set_device(device)  # compiled graphs are keyed by device index
    torch._dynamo.config.fail_on_recompile_limit_hit = True  # a fall-back to eager flex fails loudly
    torch._dynamo.config.cache_size_limit = 32  # variants recompile the same code at two recipes
    if args.tiny:
        configs = ["tiny-cpu"]
        overrides = ["data.seq_len=256", "optim.anchors=16", "drafter.layers=2", *args.overrides]
        variants = [v for v in VARIANTS if v.name in {"trainer", "recompute head", "chunk 4096"}]
    else:
        configs = args.config or ["qwen3-8b-b16", "seed-b32"]
        overrides, variants = args.overrides, list(VARIANTS)
    if args.variant:
        variants = [v for v in variants if v.name in args.variant]

    began = time.perf_counter()
    result: dict[str, Any] = {
        "device": device_name(device),
        "torch": torch.__version__,
        "peak_tflops": args.peak_tflops,
        "recipes": {},
        "rows": [],
        "errors": [],
        "skipped": [],
    }
    for index, config in enumerate(configs):
        recipe = Recipe.load(config, overrides, device)
        result["recipes"][recipe.name] = recipe.shapes()
        # An equal share of what is left for each recipe still to run (the cheap one hands time on).
        now = time.perf_counter()
        deadline = now + (began + args.budget_s - now) / (len(configs) - index)
        frozen = frozen_weights(recipe, device)
        for variant in variants:
            if time.perf_counter() > deadline:
                result["skipped"].append(f"{recipe.name}/{variant.name}: over the time budget")
                continue
            try:
                result["rows"].append(
                    run_variant(recipe, variant, frozen, device, args.warmup, args.repeats, args.peak_tflops)
                )
            except Exception as exc:  # OOM, compile failure: keep the other rows
                result["errors"].append(describe_error(f"{recipe.name}/{variant.name}", exc))
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            add_ratios(result["rows"])
            write_result(args.out, result)
        del frozen
    result["wall_s"] = round(time.perf_counter() - began, 1)
    write_result(args.out, result)
    print_table(result)
    print(f"wrote {args.out}")
    return 0 if result["rows"] else 1


def add_ratios(rows: list[dict[str, Any]]) -> None:
    base = {r["recipe"]: r["step_ms"] for r in rows if r["variant"] == "trainer"}
    for row in rows:
        row["vs_trainer"] = round(base[row["recipe"]] / row["step_ms"], 3) if row["recipe"] in base else None


def print_table(result: dict[str, Any]) -> None:
    print_rows(
        f"drafter step variants ({result['device']}, torch {result['torch']})", COLUMNS, result["rows"]
    )
    for row in result["rows"]:
        for kernel in row.get("top_kernels", [])[:5]:
            print(
                f"  {row['recipe']}/{row['variant']} top: {kernel['share']:.1%} {kernel['ms']} ms {kernel['name'][:90]}"
            )
    for line in result["errors"] + result["skipped"]:
        print(f"note: {line}")


if __name__ == "__main__":
    raise SystemExit(main())
