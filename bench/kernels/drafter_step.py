"""One drafter training step (forward + backward + AdamW) timed, with model FLOPs and MFU.

Rows vary one knob against the first row (the baseline), all in the same run: the LM-head chunk size
and the dtype of the frozen embedding / LM head (fp32 buffers are re-cast to bf16 by autocast on every
chunk; bf16 buffers are not).

    .venv/bin/python -m bench.kernels.drafter_step                      # CPU, small shapes, SDPA
    python -m bench.kernels.drafter_step --preset qwen3-8b              # GPU: Qwen3-8B drafter, compiled flex, bf16

FLOPs count what the model must do (the REFERENCE.md convention): trainable matmuls x3 (fwd + 2 bwd),
the frozen LM head x2 (fwd + grad to its input; a recompute is never counted), attention over
the unmasked (query, key) pairs only. `fc` is counted x3 like every trainable matmul although its input
(the captured states) needs no gradient: 0.5 of ~72.5 TFLOP at qwen3-8b-b16 (0.7%), kept so the figures
compare with REFERENCE.md's. MFU = FLOPs / time / peak (default 790 TFLOP/s: the bf16 matmul
ceiling measured on an H200; the datasheet's 989 is printed too).
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from bench.lib.flops import model_flops
from trainer.model.anchors import sample_anchors
from trainer.model.attention import dense_mask
from trainer.model.drafter import DFlashDrafter, DrafterConfig

PRESETS = {
    "cpu-small": dict(
        cfg=dict(hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, vocab_size=4096, target_layer_ids=[1, 3, 5]),
        batch=1, seq_len=512, anchors=32, block_size=16, attention="sdpa", chunks=[256, 2048],
    ),
    "qwen3-8b": dict(
        cfg=dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=5, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936, target_layer_ids=[1, 9, 17, 25, 33]),
        batch=1, seq_len=3072, anchors=512, block_size=16, attention="flex", chunks=[2048, 4096, 8192],
    ),
}  # fmt: skip


def run_row(
    preset: dict, loss_chunk: int, frozen_dtype: torch.dtype, device: torch.device, steps: int
) -> dict:
    cfg = DrafterConfig(
        **preset["cfg"], rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=40960,
        block_size=preset["block_size"], mask_token_id=preset["cfg"]["vocab_size"] - 1, num_target_layers=36,
    )  # fmt: skip
    torch.manual_seed(0)
    frozen = torch.randn(cfg.vocab_size, cfg.hidden_size, device=device, dtype=frozen_dtype) * 0.02
    model = DFlashDrafter(cfg, frozen, frozen, attention=preset["attention"], loss_chunk=loss_chunk).to(
        device
    )
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
    b, s = preset["batch"], preset["seq_len"]
    gen = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size - 1, (b, s), device=device, generator=gen)
    loss_mask = torch.ones(b, s, dtype=torch.bool, device=device)
    hidden_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    hidden = torch.randn(b, s, cfg.num_context_features * cfg.hidden_size, device=device, generator=gen).to(
        hidden_dtype
    )
    autocast = torch.autocast("cuda", torch.bfloat16) if device.type == "cuda" else nullcontext()

    def step() -> None:
        anchors, valid = sample_anchors(loss_mask, preset["anchors"], cfg.block_size, gen)
        with autocast:
            out = model(ids, loss_mask, hidden, anchors, valid)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    began = time.perf_counter()
    step()  # compile / warm
    sync(device)
    first = time.perf_counter() - began
    step()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    began = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    seconds = (time.perf_counter() - began) / steps

    anchors, valid = sample_anchors(loss_mask, preset["anchors"], cfg.block_size, gen)
    mask = dense_mask(anchors, valid, s, cfg.block_size)  # (B, 1, Q, S + Q): fine at these shapes
    density, pairs = float(mask.float().mean()), float(mask.sum())
    q_len = preset["anchors"] * cfg.block_size
    flops = model_flops(cfg, b, s, q_len, pairs)
    return {
        "loss_chunk": loss_chunk,
        "frozen_dtype": str(frozen_dtype).removeprefix("torch."),
        "first_step_s": round(first, 3),
        "step_ms": round(seconds * 1000, 2),
        "tflop_per_step": round(flops / 1e12, 3),
        "tflops": round(flops / seconds / 1e12, 4),
        "mask_density": round(density, 4),
        "peak_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        if device.type == "cuda"
        else None,
        "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--peak-tflops", type=float, default=790.0)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    name = args.preset or ("qwen3-8b" if device.type == "cuda" else "cpu-small")
    preset = PRESETS[name]
    if preset["attention"] == "flex" and device.type != "cuda":
        raise SystemExit(f"preset {name} trains with compiled flex: it needs a CUDA GPU")

    rows = [run_row(preset, chunk, torch.float32, device, args.steps) for chunk in preset["chunks"]]
    if device.type == "cuda":
        rows.append(run_row(preset, preset["chunks"][0], torch.bfloat16, device, args.steps))
    base = rows[0]["step_ms"]
    for row in rows:
        row["vs_baseline"] = round(base / row["step_ms"], 3)
        row["mfu"] = round(row["tflops"] / args.peak_tflops, 5)
        row["mfu_vs_989"] = round(row["tflops"] / 989.0, 4)

    table = Table(title=f"drafter step ({name}, {preset['attention']}, {device})")
    columns = (
        "loss_chunk",
        "frozen_dtype",
        "step_ms",
        "vs_baseline",
        "tflops",
        "mfu",
        "peak_gib",
        "first_step_s",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*(str(row[c]) for c in columns))
    Console().print(table)
    result = {
        "preset": name,
        "shapes": {k: preset[k] for k in ("batch", "seq_len", "anchors", "block_size", "attention")}
        | preset["cfg"],
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "peak_tflops": args.peak_tflops,
        "rows": rows,
    }
    out = Path(__file__).resolve().parents[1] / "results" / "drafter_step.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
