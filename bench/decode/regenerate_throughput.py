"""`data regenerate`'s torch engine on one device: generated tok/s per batch size, against the decode roofline.

Each row runs `trainer.regenerate.engines.generate_token_batch` (what the engine runs) on random prompts of a fixed
length with no stop token, so every row generates exactly `--new-tokens` per sequence. The roofline is that of
decoding: every step reads the weights once (bf16: 2 bytes per parameter, the input embedding excluded: a
lookup reads one row), so steps/s <= bandwidth / weight bytes and tok/s <= batch x that, until compute binds
(2 FLOPs per parameter per token at the bf16 peak). The KV cache read is left out (small at these lengths).

    python3 -m bench.decode.regenerate_throughput                      # GPU: random:qwen3-8b, batch 1..128
    .venv/bin/python -m bench.decode.regenerate_throughput --tiny      # CPU dry run: the tiny target
    python3 -m bench.decode.regenerate_throughput --target runs/smollm2-135m/target --batches 64,256,1024
    python3 -m bench.decode.regenerate_throughput --target-config bench/decode/shapes/smollm2-135m.json \
        --prompt-lens 100-450 --batches 128,2048 --variants eager --profile   # no weights to carry

`--target-config` builds the model from a config.json with random weights (a decode step's cost does not
depend on the weights; `generate` is held to exactly `--new-tokens` with no stop token either way).
`--prompt-lens LO-HI` gives each row its own prompt length, left-padded into the batch as `data regenerate`
pads real chats (the fixed `--prompt-len` pads nothing). `--profile` times the last batch's prefill and a decode step, and
records 16 decode steps under torch.profiler: the top operations by device and by host time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

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
from trainer.regenerate.generate_engine import generate_token_batch
from trainer.regenerate.settings import GenerationSettings
from trainer.runspec.target_shapes import is_embedded
from trainer.target_model.load import load_target_model
from trainer.target_model.tiny import build_embedded_target

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
    parser.add_argument(
        "--target-config", help="a config.json: that architecture with random weights (nothing to carry)"
    )
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--prompt-lens", help="LO-HI: a length per row, left-padded (as real chats are)")
    parser.add_argument(
        "--variants", default="eager,static", help="eager (dynamic cache), static (compiled step, CUDA)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="a decode step timed and profiled (the last batch)"
    )
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batches", default="1,4,16,32,64,128")
    parser.add_argument("--out", default=str(RESULTS / "regenerate_throughput.json"))
    args = parser.parse_args()
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    target = "tiny" if args.tiny else args.target
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    if args.target_config:
        target = f"random weights, {args.target_config}"
        model = random_model(Path(args.target_config), device, dtype)
    elif is_embedded(target):
        model = build_embedded_target(target, seed=0, device=device, dtype=dtype).eval()
    else:  # a folder: a real model, e.g. a small one whose decode step is bound by kernel launches
        model = load_target_model(target, 0, device, dtype).eval()
    vocab = model.config.vocab_size
    settings = GenerationSettings(target=target, max_new_tokens=args.new_tokens)
    rows: list[dict[str, Any]] = []
    errors: list[str] = []
    wanted = set(args.variants.split(","))
    variants = {"dynamic cache, eager": False, "static cache, compiled": True}
    variants = {k: v for k, v in variants.items() if ("static" if v else "eager") in wanted}
    last_call: Any = None  # the last batch that ran, for --profile
    for variant, static in variants.items():
        if static and device.type != "cuda":
            continue  # transformers compiles the static-cache decode step on GPUs only
        for batch in [int(b) for b in args.batches.split(",")]:
            gen = torch.Generator().manual_seed(batch)
            prompts = random_prompts(vocab, batch, args.prompt_len, args.prompt_lens, gen)

            def call(
                prompts: list[list[int]] = prompts,
                static: bool = static,
                settings: GenerationSettings = settings,
            ) -> list[list[int]]:
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
                    "ms a step": round(1000 * seconds / args.new_tokens, 1),  # the prefill included
                    "tok/s": round(tok_s, 1),
                    "roofline tok/s": round(roof, 1),
                    "of roofline": f"{tok_s / roof:.1%}",
                    "peak GiB": peak_gib(device),
                }
            )
            print_rows("data regenerate, torch engine", list(rows[-1]), rows[-1:])
            last_call = call
    profile = profile_steps(settings, last_call, device) if args.profile and last_call is not None else None
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
            "prompt_len": args.prompt_lens or args.prompt_len,
            "profile": profile,
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


def random_model(config_json: Path, device: torch.device, dtype: torch.dtype) -> Any:
    """The architecture a config.json names, random weights, on `device` in `dtype`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**json.loads(config_json.read_text()))
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: an 8B model's init on the CPU takes minutes
        return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def random_prompts(
    vocab: int, batch: int, fixed: int, ragged: str | None, gen: torch.Generator
) -> list[list[int]]:
    """Random token prompts: all `fixed` long, or each its own length in LO-HI (`ragged`)."""
    if not ragged:
        return torch.randint(1, vocab - 1, (batch, fixed), generator=gen).tolist()
    low, high = (int(x) for x in ragged.split("-"))
    lengths = torch.randint(low, high + 1, (batch,), generator=gen).tolist()
    return [torch.randint(1, vocab - 1, (n,), generator=gen).tolist() for n in lengths]


def profile_steps(
    settings: GenerationSettings, call: Any, device: torch.device, steps: int = 16
) -> dict[str, Any]:
    """The last batch again under torch.profiler, cut to 1 + `steps` new tokens (the prefill and `steps`
    decode steps), and timed alone with 1 new token (the prefill) and with 1 + `steps` (no profiler): where a
    decode step's time goes on the device and on the host."""
    from dataclasses import replace

    from torch.profiler import ProfilerActivity, profile

    prefill_s = timed(lambda: call(settings=replace(settings, max_new_tokens=1)), device)[1]
    both_s = timed(lambda: call(settings=replace(settings, max_new_tokens=1 + steps)), device)[1]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        call(settings=replace(settings, max_new_tokens=1 + steps))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    events = prof.key_averages()

    def top(key: str) -> list[dict[str, Any]]:
        ranked = sorted(events, key=lambda e: getattr(e, key, 0.0), reverse=True)[:15]
        return [
            {"name": e.key, "calls": e.count, "ms": round(getattr(e, key, 0.0) / 1000, 3)} for e in ranked
        ]

    device_key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    out: dict[str, Any] = {
        "prefill_s": round(prefill_s, 3),
        "decode_step_ms": round(1000 * (both_s - prefill_s) / steps, 2),
        "top_device": top(device_key),
        "top_host": top("self_cpu_time_total"),
    }
    print(f"prefill {out['prefill_s']} s; a decode step {out['decode_step_ms']} ms (without the profiler)")
    for name in ("top_device", "top_host"):
        print(f"{name} (prefill + {steps} decode steps)")
        for r in out[name]:
            print(f"  {r['ms']:>10.3f} ms  {r['calls']:>6}  {r['name'][:100]}")
    return out


if __name__ == "__main__":
    sys.exit(main())
