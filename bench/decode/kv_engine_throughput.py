"""`data regenerate`'s two torch engines in one run: today's (transformers' `generate`, batches sorted by
length) against the KV engine (a preallocated cache, CUDA-graph decode steps, continuous batching), on the
same prompts; generated tok/s, the ratio, the KV engine's roofline share, and whether the tokens agree
(answers that differ: each first flip classified as a bf16 near-tie or a real difference, `engine_ties.py`).

    # a real target and real chats (answers stop where the target stops):
    python3 -m bench.decode.kv_engine_throughput --target runs/smollm2-135m/target \
        --prompts runs/smollm2-135m/prompts/train.jsonl --num 4096 --max-new-tokens 384 --baseline-batch 2048
    # a config's shapes with random weights (no stop token: every row decodes --max-new-tokens):
    python3 -m bench.decode.kv_engine_throughput --target-config bench/decode/shapes/qwen3-8b.json \
        --prompt-lens 100-450 --num 512 --max-new-tokens 256 --baseline-batch 128
    .venv/bin/python -m bench.decode.kv_engine_throughput --tiny      # CPU dry run: the tiny target folder

Rates are generated tokens over the wall time of the whole call (tokenising, prefill and decode); the KV
engine's decode-only rate is what its roofline share compares (trainer.engine.roofline).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.decode.engine_ties import classify_answers
from bench.decode.regenerate_throughput import random_model, random_prompts
from bench.lib.roles import RESULTS, device_name, print_rows, write_result
from trainer.engine.decoder import KVDecoder, kv_bytes_per_token
from trainer.engine.roofline import decode_roofline, peaks_of
from trainer.engine.sampling import row_key
from trainer.engine.scheduler import Scheduler, auto_slots
from trainer.regenerate.generate_engine import TorchEngine, generate_token_batch
from trainer.regenerate.kv_engine import KVEngine
from trainer.regenerate.settings import GenerationSettings


def synced(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def real_chats(path: Path, num: int) -> list[list[dict[str, str]]]:
    from trainer.regenerate.conversations import read_records

    chats = []
    for item in read_records(path):
        if hasattr(item, "messages"):
            first = next(
                (i for i, m in enumerate(item.messages) if m["role"] == "assistant"), len(item.messages)
            )
            chats.append([dict(m) for m in item.messages[:first]])
        if len(chats) == num:
            break
    return chats


def compare_real(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    settings = GenerationSettings(target=args.target, max_new_tokens=args.max_new_tokens)
    chats = real_chats(Path(args.prompts), args.num)
    rows: dict[str, Any] = {"prompts": len(chats)}
    began = synced(device)
    kv = KVEngine(settings, str(device), slots=args.slots)
    loaded = synced(device)
    new = kv.generate(chats)
    done = synced(device)
    rows["kv"] = {"seconds": done - loaded, "tokens": sum(c.tokens for c in new), "load_s": loaded - began}
    rows["kv"] |= kv.report() | roofline_of(kv.model, kv.stats, device)
    if args.temperature > 0:  # the sampled path's cost, the same prompts, one key each
        sampled_settings = GenerationSettings(
            target=args.target,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
        )
        kv.settings = sampled_settings
        keys = [row_key(0, f"p{i}", 0) for i in range(len(chats))]
        t0 = synced(device)
        sampled = kv.generate(chats, keys)
        rows["kv_sampled"] = {"seconds": synced(device) - t0, "tokens": sum(c.tokens for c in sampled)}
        kv.settings = settings
    kv.close()
    del kv
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if args.baseline_batch:
        old_engine = TorchEngine(settings, str(device), batch_size=args.baseline_batch)
        take = chats[: args.baseline_num or len(chats)]
        t0 = synced(device)
        old = old_engine.generate(take)
        t1 = synced(device)
        rows["generate"] = {"seconds": t1 - t0, "tokens": sum(c.tokens for c in old), "prompts": len(take)}
        same = sum(a == b for a, b in zip(old, new, strict=False))
        rows["identical_answers"] = same
        rows["different_answers"] = len(take) - same
        # each differing pair's first flip judged by one forward over the shared prefix: rounding or not
        rows["answers"] = classify_answers(
            old_engine.model, old_engine.tokenizer, old_engine.stop_ids, take, old, new[: len(take)]
        )
        rows["speedup"] = rate(rows["kv"]) / rate(rows["generate"]) if rate(rows["generate"]) else None
    return rows


def compare_shapes(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = random_model(Path(args.target_config), device, dtype)
    gen = torch.Generator().manual_seed(0)
    prompts = random_prompts(model.config.vocab_size, args.num, 128, args.prompt_lens, gen)
    settings = GenerationSettings(target="random", max_new_tokens=args.max_new_tokens)
    max_len = max(len(p) for p in prompts) + args.max_new_tokens
    kv_bytes = kv_bytes_per_token(model.config, dtype)
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    rows: dict[str, Any] = {"prompts": len(prompts), "kernel_max_error": kernel_error(model, device, dtype)}
    runs = [(slots, True) for slots in args.slot_list]
    if args.sdpa_too:  # the same job with SDPA's padded attention, for the kernel's share of the gain
        runs.append((args.slot_list[0], False))
    for slots, exact in runs:
        fit = auto_slots(model, max_len, kv_bytes, slots, free)
        decoder = KVDecoder(model, fit, max_len)
        decoder.exact_lengths = decoder.exact_lengths and exact
        Scheduler(
            decoder, prompts[: min(len(prompts), fit)], 8, []
        ).run()  # capture the graphs it will replay
        t0 = synced(device)
        out, stats = Scheduler(decoder, prompts, args.max_new_tokens, []).run()
        seconds = synced(device) - t0
        name = f"kv_{fit}" + ("" if decoder.exact_lengths else "_sdpa")
        rows[name] = {"seconds": seconds, "tokens": sum(len(r) for r in out), "slots": fit}
        rows[name] |= {"exact_lengths": decoder.exact_lengths, "steps": stats.steps, "graphs": stats.graphs}
        rows[name] |= {"decode_s": round(stats.decode_s, 3), "prefill_s": round(stats.prefill_s, 3)}
        rows[name] |= roofline_of(model, stats, device)
        del decoder
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.baseline_batch:
        take = prompts[: args.baseline_num or len(prompts)]
        t0 = synced(device)
        produced = 0
        for start in range(0, len(take), args.baseline_batch):
            batch = take[start : start + args.baseline_batch]
            produced += sum(len(r) for r in generate_token_batch(model, batch, settings, 0, [], seed=0))
        rows["generate"] = {"seconds": synced(device) - t0, "tokens": produced, "prompts": len(take)}
        best = max(rate(v) for k, v in rows.items() if k.startswith("kv_"))
        rows["speedup"] = best / rate(rows["generate"])
    return rows


def kernel_error(model: Any, device: torch.device, dtype: torch.dtype) -> float | None:
    """The decode-attention kernel against masked SDPA in the model's dtype, at its head shapes."""
    from trainer.kernels.cached_attention import _sdpa_reference, decode_attention, triton_available

    if not triton_available(device.type):
        return None
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(64, heads, head_dim, device=device, dtype=dtype, generator=gen)
    k = torch.randn(64, kv_heads, 1024, head_dim, device=device, dtype=dtype, generator=gen)
    v = torch.randn(64, kv_heads, 1024, head_dim, device=device, dtype=dtype, generator=gen)
    lengths = torch.randint(1, 1025, (64,), device=device, generator=gen).to(torch.int32)
    got = decode_attention(q, k, v, lengths, head_dim**-0.5).float()
    want = _sdpa_reference(q.float(), k.float(), v.float(), lengths, head_dim**-0.5)
    return float((got - want).abs().max())


def roofline_of(model: Any, stats: Any, device: torch.device) -> dict[str, Any]:
    peaks = peaks_of(device_name(device)) if device.type == "cuda" else None
    if peaks is None:
        return {"roofline": None}
    kv = kv_bytes_per_token(model.config, next(model.parameters()).dtype)
    return decode_roofline(model, stats, kv, peaks).to_json()


def rate(row: dict[str, Any]) -> float:
    return row["tokens"] / row["seconds"] if row.get("seconds") else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tiny", action="store_true", help="CPU dry run on the tiny target folder")
    parser.add_argument("--target", help="a model folder with a tokenizer (real chats)")
    parser.add_argument("--prompts", help="JSONL prompt records for --target")
    parser.add_argument("--target-config", help="a config.json: random weights, token prompts")
    parser.add_argument("--prompt-lens", default="100-450", help="LO-HI prompt lengths for --target-config")
    parser.add_argument("--num", type=int, default=512)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--slots", type=int, default=None, help="KV engine rows at once (default: its own)")
    parser.add_argument(
        "--slot-list", default="2048", help="--target-config: slot counts to try, e.g. 128,512,2048"
    )
    parser.add_argument("--sdpa-too", action="store_true", help="also time SDPA's attention (first slots)")
    parser.add_argument("--baseline-batch", type=int, default=128, help="generate's batch (0: skip it)")
    parser.add_argument("--baseline-num", type=int, default=0, help="prompts for generate (0: all)")
    parser.add_argument("--temperature", type=float, default=0.0, help="> 0: also time sampled decoding")
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--out", default=str(RESULTS / "kv_engine_throughput.json"))
    args = parser.parse_args()
    args.slot_list = [int(s) for s in args.slot_list.split(",")]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.tiny:
        from bench.lib.target_folder import make_target_folder

        folder = make_target_folder(Path(tempfile.mkdtemp()) / "target")
        records = Path(tempfile.mkdtemp()) / "p.jsonl"
        lines = [{"id": f"p{i}", "prompt": " ".join(f"w{j}" for j in range(1 + i % 30))} for i in range(32)]
        records.write_text("".join(json.dumps(line) + "\n" for line in lines))
        args.target, args.prompts, args.num, args.max_new_tokens, args.baseline_batch = (
            str(folder),
            str(records),
            32,
            16,
            8,
        )
    rows = compare_real(args, device) if args.target else compare_shapes(args, device)
    table = [
        {
            "engine": k,
            "tok/s": round(rate(v)),
            "tokens": v["tokens"],
            "s": round(v["seconds"], 2),
            **{x: v[x] for x in ("slots", "share_of_roofline", "roofline_tok_s") if x in v},
        }
        for k, v in rows.items()
        if isinstance(v, dict) and "tokens" in v
    ]
    columns = ("engine", "tok/s", "tokens", "s", "slots", "share_of_roofline", "roofline_tok_s")
    print_rows("data regenerate: generate vs the KV engine", columns, table)
    print({k: v for k, v in rows.items() if not isinstance(v, dict)})
    if "answers" in rows:
        print("answers:", {k: v for k, v in rows["answers"].items() if k != "different_examples"})
    write_result(Path(args.out), {"device": device_name(device), "args": vars(args), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
