"""Drafter step variants at each recipe's shapes: find the bottleneck, measure each predicted effect.

Every row is the REAL drafter (`trainer.warmup.build_drafter`) stepped by the REAL `trainer.train.train_step`
(anchors, bf16 autocast, forward, backward, grad clip, AdamW, schedule); a variant only wraps or patches
from here (nothing under trainer/ is edited). Rows, each against the first ("trainer"), same run:

  trainer          what a drafter rank runs today: fp32 frozen embed/head, loss_chunk from the config,
                   eager layers, compiled flex + compiled block mask on CUDA, fused AdamW on CUDA
  all on           every change below at once (the predicted best; profiled: top-10 kernels in the JSON)
  frozen bf16      embed/LM head held in bf16 (autocast no longer casts the fp32 head on every chunk)
  compiled layers  `layer.compile()` on each decoder layer (Inductor fuses the norms, RoPE, SwiGLU)
  compiled loss    `torch.compile` of the LM head + CE chunk (no fp32 logits copy materialised)
  chunk N          loss_chunk = N rows per checkpointed LM-head chunk
  foreach AdamW    the unfused multi-tensor AdamW instead of the fused kernel

Each variant starts from the same seeded init, batch and anchors, so `first_loss` must agree across rows
(bf16 tolerance): a variant that changes the numbers is wrong, not fast. FLOPs and MFU: bench/flops.py.

    python3 bench/drafter_variants.py --config qwen3-8b-b16 --config seed-b32 --budget-s 200
    .venv/bin/python bench/drafter_variants.py --tiny          # CPU dry run (SDPA, small shapes)
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trainer.loss
from bench.flops import H200_BF16_PEAK_TFLOPS
from bench.roles import (
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
from trainer.drafter import DFlashDrafter


@dataclass(frozen=True)
class Variant:
    name: str
    prediction: str
    frozen_bf16: bool = False
    loss_chunk: int | None = None  # None: the config's
    compile_layers: bool = False
    compile_loss: bool = False
    fused_adamw: bool = True
    profile: bool = False


VARIANTS = (
    Variant("trainer", "the baseline"),
    Variant(
        "all on",
        "sum of the rows below: 15-30% faster at b16, less at b32 (attention is a larger share there)",
        frozen_bf16=True, loss_chunk=4096, compile_layers=True, compile_loss=True, profile=True,
    ),
    Variant(
        "frozen bf16",
        "no fp32->bf16 cast of the 622M-value head per chunk pass (3 passes x ~3.7 GB each): ~1 ms per "
        "chunk pass, 2-5%; 2.5 GB less memory",
        frozen_bf16=True,
    ),
    Variant(
        "compiled layers",
        "fp32 RMSNorm/RoPE/SwiGLU elementwise traffic fused: 5-15% at b16, 3-8% at b32",
        compile_layers=True,
    ),
    Variant(
        "compiled loss",
        "fp32 logits (chunk x 151936 x 4 B = 1.2 GB at 2048 rows) not materialised, CE+argmax fused: 3-8%",
        compile_loss=True,
    ),
    Variant("chunk 4096", "half the chunk passes (fewer casts and launches): 1-3%, +1.2 GB", loss_chunk=4096),
    Variant("chunk 8192", "a quarter of the passes: 1-4%, +3.7 GB peak", loss_chunk=8192),
    Variant("foreach AdamW", "unfused multi-tensor AdamW: 1-3% slower than fused", fused_adamw=False),
)  # fmt: skip

COLUMNS = ("recipe", "variant", "step_ms", "vs_trainer", "samples_s", "tok_s", "tflops", "mfu", "peak_gib",
           "first_step_s", "first_loss")  # fmt: skip


@contextmanager
def compiled_loss_chunk(enabled: bool) -> Iterator[None]:
    """Swap trainer.loss's per-chunk head+CE for a compiled copy (looked up at call time), then restore."""
    original = trainer.loss._head_and_ce
    if enabled:
        trainer.loss._head_and_ce = torch.compile(original, dynamic=False)
    try:
        yield
    finally:
        trainer.loss._head_and_ce = original


def apply_variant(model: DFlashDrafter, variant: Variant) -> None:
    if variant.frozen_bf16:
        model.embed_weight = model.embed_weight.to(torch.bfloat16)
        model.lm_head_weight = model.lm_head_weight.to(torch.bfloat16)
    if variant.loss_chunk:
        model.loss_chunk = variant.loss_chunk
    if variant.compile_layers:
        for layer in model.layers:
            layer.compile(dynamic=False)


def foreach_adamw(recipe: Recipe) -> Any:
    optim = recipe.cfg.optim

    def build(model: DFlashDrafter) -> torch.optim.Optimizer:
        params = [p for p in model.parameters() if p.requires_grad]
        return torch.optim.AdamW(
            params, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay, fused=False, foreach=True
        )

    return build


def top_kernels(role: DrafterRole, batch: Any, count: int = 10) -> list[dict[str, Any]]:
    """One profiled step: the `count` kernels (CUDA) or ops (CPU) with the most self time."""
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

    events = [e for e in prof.key_averages() if self_us(e) > 0]
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
    recipe: Recipe,
    variant: Variant,
    frozen: tuple[torch.Tensor, torch.Tensor],
    device: torch.device,
    warmup: int,
    repeats: int,
    peak_tflops: float,
) -> dict[str, Any]:
    optimizer = None if variant.fused_adamw else foreach_adamw(recipe)
    role = DrafterRole.build(recipe, device, frozen=frozen, optimizer=optimizer)
    apply_variant(role.model, variant)
    batch = random_batch(recipe, role.model, device, seed=11)
    with compiled_loss_chunk(variant.compile_loss):
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
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=float("inf"), help="skip variants past this time")
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_PEAK_TFLOPS)
    parser.add_argument("--out", type=Path, default=RESULTS / "drafter_variants.json")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    torch._dynamo.config.fail_on_recompile_limit_hit = True  # a fall-back to eager flex fails loudly
    torch._dynamo.config.cache_size_limit = 32  # variants recompile the same code at two recipes
    if args.tiny:
        configs = ["tiny-cpu"]
        overrides = ["data.seq_len=256", "optim.anchors=16", "drafter.layers=2", *args.overrides]
        variants = [v for v in VARIANTS if v.name in {"trainer", "all on", "frozen bf16", "chunk 4096"}]
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
