"""The target role alone on one device: capture tok/s, TFLOP/s, MFU and peak memory, vs the full model.

Rows per sequence length, measured in the same run on the same weights:
  full model    the whole causal LM (every layer + LM head, `output_hidden_states=True`), the captured
                layers picked from its hidden states: what earlier trainers run (the baseline)
  capture       OUR path: `trainer.target_model.capture.CaptureTarget` (layers past the last captured one and the LM
                head dropped, forward hooks on the captured layers), as `load_capture_target` builds it
  capture +compiled    `target.compile_layers = true` (each kept layer's forward compiled; the default)
The model is built once (`trainer.target_model.tiny.build_embedded_target`: seeded random weights) and cut after the
baseline rows. FLOPs: `bench/lib/flops.py` (count what each variant must compute; the full model's are larger,
so compare the two by tok/s, not by MFU).

    python3 -m bench.kernels.target_capture                                   # GPU: random:qwen3-8b, S=3072 and 40000
    .venv/bin/python -m bench.kernels.target_capture --tiny                   # CPU dry run: the tiny target
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from bench.lib.flops import H200_BF16_PEAK_TFLOPS, target_flops
from bench.lib.roles import (
    RESULTS,
    describe_error,
    device_name,
    median,
    peak_gib,
    print_rows,
    reset_peak,
    time_repeats,
    write_result,
)
from trainer.model.device import target_dtype
from trainer.runspec.config import load_config
from trainer.runspec.target_shapes import target_hf_config
from trainer.target_model.capture import CaptureTarget
from trainer.target_model.tiny import build_embedded_target

COLUMNS = ("variant", "seq_len", "layers", "ms", "tok_s", "tflops", "mfu", "peak_gib", "vs_full")


def full_model_capture(model: Any, ids: torch.Tensor, layer_ids: list[int]) -> torch.Tensor:
    """The baseline: the whole model with every hidden state, the captured layers concatenated."""
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=False, output_hidden_states=True)
        return torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)


def measure(
    variant: str,
    run: Any,
    hf_config: Any,
    seq_len: int,
    layers: int,
    lm_head: bool,
    device: torch.device,
    warmup: int,
    repeats: int,
    peak_tflops: float,
) -> dict[str, Any]:
    reset_peak(device)
    seconds = median(time_repeats(run, device, warmup, repeats))
    flops = target_flops(hf_config, seq_len, layers, lm_head)
    return {
        "variant": variant,
        "seq_len": seq_len,
        "layers": layers,
        "lm_head": lm_head,
        "ms": round(seconds * 1000, 2),
        "tok_s": round(seq_len / seconds, 1),
        "samples_s": round(1 / seconds, 4),
        "tflop_per_sample": round(flops / 1e12, 3),
        "tflops": round(flops / seconds / 1e12, 2),
        "mfu": round(flops / seconds / 1e12 / peak_tflops, 4),
        "peak_gib": peak_gib(device),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="qwen3-8b-b16", help="trainer config: the target and layer ids")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[3072, 40000])
    parser.add_argument("--tiny", action="store_true", help="CPU dry run: the tiny target, short sequences")
    parser.add_argument("--no-full", action="store_true", help="skip the untruncated baseline")
    parser.add_argument("--no-variants", action="store_true", help="only the default capture rows")
    parser.add_argument("--device", default=None, help="cuda:N (default: cuda, or cpu with --tiny)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_PEAK_TFLOPS)
    parser.add_argument("--out", type=Path, default=RESULTS / "target_capture.json")
    args = parser.parse_args()

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.tiny else "cpu"))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    overrides = ['target.path="tiny"', "drafter.target_layer_ids=[0, 1, 2]"] if args.tiny else []
    cfg = load_config("tiny-cpu" if args.tiny else args.config, overrides)
    seq_lens = [64, 256] if args.tiny else args.seq_lens
    layer_ids = list(cfg.drafter.target_layer_ids or [])
    hf_config = target_hf_config(cfg.target.path)
    dtype = target_dtype(cfg.target.dtype, device)

    began = time.perf_counter()
    model = build_embedded_target(cfg.target.path, cfg.run.seed, device, dtype)
    build_s = time.perf_counter() - began
    vocab, total_layers = int(hf_config.vocab_size), int(hf_config.num_hidden_layers)
    gen = torch.Generator(device=device).manual_seed(1)
    inputs = {s: torch.randint(0, vocab - 1, (1, s), device=device, generator=gen) for s in seq_lens}
    common = dict(device=device, warmup=args.warmup, repeats=args.repeats, peak_tflops=args.peak_tflops)
    result: dict[str, Any] = {
        "config": str(cfg.target.path),
        "layer_ids": layer_ids,
        "dtype": str(dtype).removeprefix("torch."),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "device": device_name(device),
        "torch": torch.__version__,
        "peak_tflops": args.peak_tflops,
        "build_s": round(build_s, 2),
        "rows": [],
        "errors": [],
    }

    def record(row_fn: Any, label: str) -> None:
        try:
            result["rows"].append(row_fn())
        except Exception as exc:  # one failing row (e.g. out of memory) must not lose the others
            result["errors"].append(describe_error(label, exc))
            if device.type == "cuda":
                torch.cuda.empty_cache()
        write_result(args.out, result)

    if not args.no_full:
        for s in seq_lens:
            ids = inputs[s]
            record(
                lambda ids=ids, s=s: measure(
                    "full model", lambda: full_model_capture(model, ids, layer_ids), hf_config, s,
                    total_layers, True, **common,
                ),
                f"full model S={s}",
            )  # fmt: skip
    # Each CaptureTarget cuts the model in place (idempotent) and wraps the same layers: the eager row
    # first, then the compiled one (compiling replaces the layers' forward for good).
    variants = [("capture", False)] if args.no_variants else [("capture", False), ("capture +compiled", True)]
    loss_masks = {s: torch.ones_like(ids, dtype=torch.bool) for s, ids in inputs.items()}
    for name, compiled in variants:
        target = CaptureTarget(model, layer_ids, compile_layers=compiled)
        for s in seq_lens:
            ids = inputs[s]
            record(
                lambda ids=ids, s=s, target=target, name=name: measure(
                    name, lambda: target.capture(ids, loss_masks[s], 0), hf_config, s, max(layer_ids) + 1,
                    False, **common,
                ),
                f"{name} S={s}",
            )  # fmt: skip
        target.close()

    full = {r["seq_len"]: r["tok_s"] for r in result["rows"] if r["variant"] == "full model"}
    for row in result["rows"]:
        row["vs_full"] = round(row["tok_s"] / full[row["seq_len"]], 3) if row["seq_len"] in full else None
    write_result(args.out, result)

    title = f"target capture ({cfg.target.path}, {result['device']}, {result['dtype']})"
    print_rows(title, COLUMNS, result["rows"], width=150)
    for error in result["errors"]:
        print(f"error: {error}")
    print(f"wrote {args.out}")
    return 0 if result["rows"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
