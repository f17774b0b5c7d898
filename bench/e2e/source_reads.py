"""What a training step's host thread spends making its batch from chat records: the first epoch (each record
rendered through the chat template, tokenised, its answers' ends trimmed) against every later epoch (the
sequences the source kept: `trainer.data.sources.KEPT_TOKENS`), the same batches in the same run.

    .venv/bin/python bench/e2e/source_reads.py --target runs/smollm2-135m/target \
        --data runs/smollm2-135m/data/greedy.jsonl --batches 64 --out bench/results/source_reads.json

Prints a table; writes JSON. The batches are the recipe's (32 sequences of seq_len 1024, loops cut) in the
order training reads them (`trainer.data.order.BatchOrder`, seed 0).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dflash_base.atomic import write_json_atomic
from trainer.data.order import BatchOrder, make_batch
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="the target folder (its tokenizer and chat template)")
    parser.add_argument("--data", required=True, help="regenerated chat records (jsonl)")
    parser.add_argument("--batches", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--loops", default="cut")
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
    print(
        f"{args.batches} batches of {args.batch_size} x {args.seq_len} from {args.data} (median per batch):"
    )
    for name, value in rows.items():
        print(f"  {name:<22} {value * 1000:8.2f} ms")
    ratio = rows["first epoch"] / max(rows["later epochs (kept)"], 1e-9)
    print(f"  speed-up               {ratio:8.1f}x; kept {source.kept_tokens:,} tokens")
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
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
