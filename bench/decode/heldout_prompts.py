"""Write a chat run's held-out conversations as an `eval --prompts` file: each up to its last answer.

`dflash-doctor eval --config C` (no --prompts) decodes the same prompts, one process; this file lets
bench/decode/eval_shards.py split them over several processes on one device. The records are the
conversations' own messages, cut before the last assistant turn; eval renders them with the chat template's
generation prompt, exactly as `trainer.eval.evaluate.chat_prompts` does.

    python3 -m bench.decode.heldout_prompts --config smollm2-135m --count 64 --out /tmp/heldout.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trainer.data.sources import split_data
from trainer.eval.prompts import before_last_answer
from trainer.runspec.config import load_config
from trainer.runspec.data_files import jsonl_records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    if cfg.data.kind != "chat":
        print(f"--config: {args.config} trains on {cfg.data.kind} data, not chat", file=sys.stderr)
        return 2
    where = cfg.data.eval_path or cfg.data.path
    assert where is not None, "load_config requires data.path for chat data"
    path = Path(where)
    records = jsonl_records(path, "data.path")
    lines: list[str] = []
    seen: set[str] = set()  # a prompt's greedy and sampled answers are one prompt: once, as `eval` takes it
    for j in split_data(cfg).eval_ids:
        if len(lines) == args.count:
            break
        _, record = records[j]
        before = before_last_answer(record["messages"])
        key = json.dumps([before, record.get("tools")], sort_keys=True)
        if before and key not in seen:
            seen.add(key)
            # a record's tools go with it: eval renders them as train did
            tools = {"tools": record["tools"]} if record.get("tools") else {}
            lines.append(json.dumps({"id": record.get("id", j), "messages": before, **tools}) + "\n")
    partial = args.out.with_name(args.out.name + ".partial")
    partial.write_text("".join(lines))
    partial.replace(args.out)
    print(f"wrote {len(lines)} held-out prompts to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
