"""`data regenerate`'s torch engine on one device: generated tok/s per batch size, against the decode roofline.

Each row runs `trainer.decode.generation.generate_token_batch` (what the engine runs) on random prompts of a fixed
length with no stop token, so every row generates exactly `--new-tokens` per sequence. The roofline is that of
decoding: every step reads the weights once (bf16: 2 bytes per parameter, the input embedding excluded: a
lookup reads one row), so steps/s <= bandwidth / weight bytes and tok/s <= batch x that, until compute binds
(2 FLOPs per parameter per token at the bf16 peak). The KV cache read is left out (small at these lengths).

    python3 bench/decode/regenerate_throughput.py                      # GPU: random:qwen3-8b, batch 1..128
    .venv/bin/python bench/decode/regenerate_throughput.py --tiny      # CPU dry run: the tiny target
    python3 bench/decode/regenerate_throughput.py --target runs/smollm2-135m/target --batches 64,256,1024
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lib.flops import H200_BF16_PEAK_TFLOPS
from bench.lib.roles import (
    RESULTS,
    describe_error,
    device_name,
    peak_gib,
    print_rows,
    reset_peak,
    write_result,
)
from trainer.decode.generation import GenerationSettings, generate_token_batch
from trainer.spec.target_shapes import is_embedded
from trainer.target.load import load_target_model
from trainer.target.tiny import build_embedded_target

H200_HBM_TBPS = 4.8  # HBM3e bandwidth of an H200 (spec sheet); a measured copy reaches ~90% of it


def decode_roofline(model: Any, batch: int, bandwidth_tbps: float, peak_tflops: float) -> float:
    """Upper bound on generated tok/s at this batch: weight reads per step, or compute, whichever binds."""
    params = sum(p.numel() for p in model.parameters())
    read = params - model.get_input_embeddings().weight.numel()
    steps_per_s = bandwidth_tbps * 1e12 / (2 * read)
    compute_tok_s = peak_tflops * 1e12 / (2 * read)
    return min(batch * steps_per_s, compute_tok_s)


def timed(call: Any, device: torch.device) -> tuple[Any, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    began = time.perf_counter()
    out = call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tiny", action="store_true", help="the tiny target on CPU (a dry run of the bench)")
    parser.add_argument(
        "--target",
        default="random:qwen3-8b",
        help="an embedded preset or a model folder (e.g. runs/smollm2-135m/target)",
    )
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batches", default="1,4,16,32,64,128")
    parser.add_argument("--out", default=str(RESULTS / "regenerate_throughput.json"))
    args = parser.parse_args()
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    target = "tiny" if args.tiny else args.target
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    if is_embedded(target):
        model = build_embedded_target(target, seed=0, device=device, dtype=dtype).eval()
    else:  # a folder: a real model, e.g. a small one whose decode step is bound by kernel launches
        model = load_target_model(target, 0, device, dtype).eval()
    vocab = model.config.vocab_size
    settings = GenerationSettings(target=target, max_new_tokens=args.new_tokens)
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    variants = {"dynamic cache, eager": False, "static cache, compiled": True}
    for variant, static in variants.items():
        if static and device.type != "cuda":
            continue  # transformers compiles the static-cache decode step on GPUs only
        for batch in [int(b) for b in args.batches.split(",")]:
            gen = torch.Generator().manual_seed(batch)
            prompts = torch.randint(1, vocab - 1, (batch, args.prompt_len), generator=gen).tolist()

            def call(prompts: list[list[int]] = prompts, static: bool = static) -> list[list[int]]:
                return generate_token_batch(model, prompts, settings, 0, [], seed=0, static_cache=static)

            try:
                reset_peak(device)
                first = timed(call, device)[1]  # warm-up: compiles the step for this shape (static)
                out, seconds = timed(call, device)
            except torch.OutOfMemoryError as exc:
                errors.append(describe_error(f"{variant} batch {batch}", exc))
                break
            generated = sum(len(r) for r in out)
            tok_s = generated / seconds
            roof = decode_roofline(model, batch, H200_HBM_TBPS, H200_BF16_PEAK_TFLOPS)
            rows.append(
                {
                    "variant": variant,
                    "batch": batch,
                    "first call s": round(first, 2),
                    "seconds": round(seconds, 2),
                    "tok/s": round(tok_s, 1),
                    "roofline tok/s": round(roof, 1),
                    "of roofline": f"{tok_s / roof:.1%}",
                    "peak GiB": peak_gib(device),
                }
            )
            print_rows("data regenerate, torch engine", list(rows[-1]), rows[-1:])
    best = max(rows, key=lambda r: r["tok/s"]) if rows else None
    default = [
        r
        for r in rows
        if r["variant"] == ("static cache, compiled" if device.type == "cuda" else "dynamic cache, eager")
    ]
    print_rows(
        f"data regenerate, torch engine ({target}, {device_name(device)})",
        list(rows[0]) if rows else [],
        rows,
    )
    if best:
        print(
            f"best: {best['variant']}, batch {best['batch']}: {best['tok/s']} tok/s ({best['of roofline']} of the decode roofline)"
        )
    path = write_result(
        Path(args.out),
        {
            "bench": "regenerate_throughput",
            "target": target,
            "device": device_name(device),
            "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens,
            "rows": rows,
            "engine_default_rows": default,
            "best": best,
            "errors": errors,
            "roofline": f"min(batch x {H200_HBM_TBPS} TB/s / weight bytes, {H200_BF16_PEAK_TFLOPS} TFLOP/s / 2 FLOPs/param)",
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
