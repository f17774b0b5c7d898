"""How much of a regenerated data set's supervision is loop tails: answers that end repeating themselves, and the
supervised tokens `data.loops = "cut"` takes out of the loss, over an evenly spaced sample of the records.

    .venv/bin/python -m bench.decode.loop_share --target runs/smollm2-135m/target \
        --data greedy=runs/smollm2-135m/data/greedy.jsonl --data sampled=runs/smollm2-135m/data/sampled.jsonl \
        --sample 2000 --out bench/results/smollm2-135m-s13-loop-share-cpu.json

Prints one line per file; writes JSON. Tokenises as training does (`trainer.data.sources.TokenizedSource`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dflash_base.atomic import write_json_atomic
from trainer.data.degenerate import ends_in_loop_text
from trainer.data.sources import TokenizedSource
from trainer.target_model.tokenizer import load_tokenizer


def share(path: str, tokenizer: object, sample: int, seq_len: int) -> dict[str, object]:
    """Loop counts over every record (the text rule `data regenerate` counts with) and, over `sample` evenly
    spaced records, the supervised tokens with loops kept and cut."""
    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    looping = sum(ends_in_loop_text(r["messages"][-1]["content"]) for r in lines)
    result: dict[str, object] = {"records": len(lines), "ending_in_loop_text": looping}
    for mode in ("keep", "cut"):
        source = TokenizedSource(path, "chat", tokenizer, seq_len, loops=mode)
        n = min(len(source), sample)
        step = max(1, len(source) // n)
        supervised = cut = left_out = unfinished = 0
        for j in range(0, n * step, step):
            chat = source.chat_tokens(j)
            supervised += sum(chat.mask)
            cut, left_out = cut + chat.ends.loops_cut, left_out + chat.ends.tokens_left_out
            unfinished += chat.ends.unfinished
        result[mode] = {
            "sampled_records": n,
            "supervised": supervised,
            "loops_cut": cut,
            "tokens_left_out": left_out,
            "unfinished": unfinished,
        }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="the target folder (its tokenizer and chat template)")
    parser.add_argument("--data", action="append", required=True, help="NAME=regenerated.jsonl")
    parser.add_argument("--sample", type=int, default=2000)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.target)
    out = {}
    for item in args.data:
        name, _, path = item.partition("=")
        out[name] = share(path, tokenizer, args.sample, args.seq_len)
        keep, cut = out[name]["keep"], out[name]["cut"]
        assert isinstance(keep, dict) and isinstance(cut, dict)
        print(
            f"{name}: {out[name]['ending_in_loop_text']} of {out[name]['records']} answers end in a loop; "
            f"cut: {cut['loops_cut']} of {cut['sampled_records']} sampled, supervised {keep['supervised']} -> "
            f"{cut['supervised']} ({1 - cut['supervised'] / max(keep['supervised'], 1):.1%} left out)"
        )
    write_json_atomic(args.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
