"""How much of each supervised answer is on the target's greedy path in the context training renders it in.

An answer the target regenerated greedily is all on its greedy path in the context it was written in; where
the trainer renders it in another context (issue 38, Q1: Qwen3's empty think block added or dropped), part
of it leaves the path, and the run's held-out walk scores the drafter against the target's greedy tokens
there, not where `eval` decodes. For every record of the config's data (each supervised span in order: the
last is the conversation's final answer), the share of supervised tokens whose target greedy prediction
(fp32, a plain HF forward, from the position before) is the token itself.

Imports only `trainer.runspec.config.load_config` and `trainer.data.sources.build_source`, so an older
checkout runs it too: `PYTHONPATH=OLD python -m bench.decode.on_greedy_path --config C --out J` from OLD.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from trainer.data.sources import build_source
from trainer.runspec.config import load_config


def spans(mask: list[bool]) -> list[tuple[int, int]]:
    """The supervised runs [start, end) of a loss mask, in order."""
    out: list[tuple[int, int]] = []
    start = None
    for i, m in enumerate([*mask, False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--limit", type=int, help="the first N records (default: all)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    cfg = load_config(args.config, [])
    model = AutoModelForCausalLM.from_pretrained(cfg.target.path, dtype=torch.float32).eval()
    source = build_source(cfg, torch.device("cpu"), int(model.config.vocab_size))
    count = len(source) if args.limit is None else min(args.limit, len(source))
    last, earlier, per = [0, 0], [0, 0], []  # [on path, supervised]
    for j in range(count):
        input_ids, loss_mask = source.get(j)
        with torch.no_grad():
            greedy = model(input_ids=input_ids[None]).logits[0].argmax(-1)
        hit = torch.zeros_like(loss_mask)
        hit[1:] = greedy[:-1] == input_ids[1:]
        runs = spans(loss_mask.bool().tolist())
        row = [int(hit[a:b].sum()) for a, b in runs], [b - a for a, b in runs]
        per.append({"record": j, "on_path": row[0], "supervised": row[1]})
        if runs:
            last[0], last[1] = last[0] + row[0][-1], last[1] + row[1][-1]
            earlier[0], earlier[1] = earlier[0] + sum(row[0][:-1]), earlier[1] + sum(row[1][:-1])
    total = {
        "records": count,
        "last_answer_on_path": last[0] / max(last[1], 1),
        "last_answer_tokens": last[1],
        "earlier_answers_on_path": earlier[0] / max(earlier[1], 1),
        "earlier_answer_tokens": earlier[1],
    }
    print(json.dumps(total))
    args.out.write_text(json.dumps({"total": total, "records": per}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
