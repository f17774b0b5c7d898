"""What a training step's host thread spends making its batch from chat records: the first epoch (each record
rendered through the chat template, tokenised, its answers' ends trimmed) against every later epoch (the
sequences the source kept: `trainer.data.sources.KEPT_TOKENS`), the same batches in the same run; and the first
epoch again with `--workers W` data workers making the sequences ahead (`trainer.data.prefetch`).

    .venv/bin/python -m bench.e2e.source_reads --target runs/smollm2-135m/target \
        --data runs/smollm2-135m/data/greedy.jsonl --batches 64 --workers 1 --out bench/results/source_reads.json

Prints a table; writes JSON. The batches are the recipe's (32 sequences of seq_len 1024, loops cut) in the
order training reads them (`trainer.data.order.BatchOrder`, seed 0). The prefetched row starts the workers,
waits `--lead-s` (in training they start before the drafter's warm-up, which takes longer), then times the
host thread's wait for each batch (`Prefetch.before` and `make_batch`) with `--step-ms` of busy host time
after each: the rest of the step, which the host thread of a host-bound step spends queuing kernels (the
recipe's H200 step, 118 ms for 2 batches of which ~37 ms was making them: ~40 ms a batch). Its batches are
checked against the first row's, bit for bit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from dflash_base.atomic import write_json_atomic
from trainer.data.order import BatchOrder, make_batch
from trainer.data.prefetch import start_prefetch
from trainer.data.sources import TokenizedSource
from trainer.target_model.tokenizer import load_tokenizer


def batch_seconds(source: TokenizedSource, order: BatchOrder, batches: int) -> list[float]:
    """Seconds to make each of the first `batches` batches of `order`."""
    seconds = []
    for index in range(batches):
        began = time.perf_counter()
        make_batch(source, order.sequence_ids(index))
        seconds.append(time.perf_counter() - began)
    return seconds


def prefetched_waits(
    args: argparse.Namespace, order: BatchOrder, made: TokenizedSource
) -> tuple[list[float], int, int]:
    """The first epoch again on a fresh source with `args.workers` workers: the host thread's wait per batch,
    the sequences the workers made, and how many sequences were read. Each batch is checked against `made`."""
    source = TokenizedSource(args.data, "chat", made.tokenizer, args.seq_len, loops=args.loops)
    upcoming = range(args.batches)
    ahead = start_prefetch(source, args.target, order, upcoming, args.workers)
    assert ahead is not None, "--workers must be >= 1"
    waits = []
    with ahead:
        time.sleep(args.lead_s)
        for index in upcoming:
            began = time.perf_counter()
            ahead.before(index)
            batch = make_batch(source, order.sequence_ids(index))
            waits.append(time.perf_counter() - began)
            expected = make_batch(made, order.sequence_ids(index))  # read back from what the first row kept
            assert all(map(torch.equal, batch, expected)), f"batch {index} differs"
            busy_until = time.perf_counter() + args.step_ms / 1000
            while time.perf_counter() < busy_until:  # the rest of a host-bound step: the host thread is busy
                pass
        delivered = ahead.delivered
    return waits, delivered, args.batches * args.batch_size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="the target folder (its tokenizer and chat template)")
    parser.add_argument("--data", required=True, help="regenerated chat records (jsonl)")
    parser.add_argument("--batches", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--loops", default="cut")
    parser.add_argument(
        "--workers", type=int, default=1, help="data workers for the prefetched row (0: none)"
    )
    parser.add_argument("--lead-s", type=float, default=10.0, help="seconds the workers run before batch 0")
    parser.add_argument("--step-ms", type=float, default=40.0, help="busy host time after each batch")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    source = TokenizedSource(args.data, "chat", load_tokenizer(args.target), args.seq_len, loops=args.loops)
    order = BatchOrder(list(range(len(source))), args.batch_size, 0)
    first = batch_seconds(source, order, args.batches)  # makes and keeps each sequence
    later = batch_seconds(source, order, args.batches)  # the same batches again: what epoch 2 on reads
    rows = {
        "first epoch": statistics.median(first),
        "later epochs (kept)": statistics.median(later),
    }
    prefetch: dict[str, Any] = {}
    if args.workers > 0:
        waits, delivered, sequences = prefetched_waits(args, order, source)
        rows[f"first, {args.workers} worker{'s' if args.workers > 1 else ''}"] = statistics.median(waits)
        prefetch = {
            "workers": args.workers,
            "usable_cores": len(os.sched_getaffinity(0)),
            "lead_s": args.lead_s,
            "step_ms": args.step_ms,
            "median_wait_s": statistics.median(waits),
            "mean_wait_s": statistics.fmean(waits),
            "p90_wait_s": statistics.quantiles(waits, n=10)[-1],
            "max_wait_s": max(waits),
            "made_by_workers": delivered,
            "sequences": sequences,
        }
    print(
        f"{args.batches} batches of {args.batch_size} x {args.seq_len} from {args.data} (median per batch):"
    )
    for name, value in rows.items():
        print(f"  {name:<22} {value * 1000:8.2f} ms")
    ratio = rows["first epoch"] / max(rows["later epochs (kept)"], 1e-9)
    print(f"  speed-up               {ratio:8.1f}x; kept {source.kept_tokens:,} tokens")
    if prefetch:
        print(
            f"  prefetched: {prefetch['workers']} worker(s) on {prefetch['usable_cores']} usable cores, "
            f"{args.lead_s:g} s lead, {args.step_ms:g} ms busy host time after each batch; wait mean "
            f"{float(prefetch['mean_wait_s']) * 1000:.2f} ms, p90 {float(prefetch['p90_wait_s']) * 1000:.2f} "
            f"ms, max {float(prefetch['max_wait_s']) * 1000:.2f} ms; {prefetch['made_by_workers']:,} of "
            f"{prefetch['sequences']:,} sequences made by the workers"
        )
    write_json_atomic(
        args.out,
        {
            "data": args.data,
            "batches": args.batches,
            "batch_size": args.batch_size,
            "seq_len": args.seq_len,
            "median_first_s": rows["first epoch"],
            "median_later_s": rows["later epochs (kept)"],
            "speed_up": ratio,
            "kept_tokens": source.kept_tokens,
            "prefetch": prefetch or None,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
