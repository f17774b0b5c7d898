"""The held-out estimate and real decoding on the same conversations, conversation by conversation.

A run's held-out figure is the decoding walk (`trainer.run.heldout.score_batch`) summed over all its held-out
sequences; `eval` decodes a few of them. To see whether the estimate predicts decoding, score the walk on
exactly the conversations an `eval --json` report decoded (same order: the run's first held-out ids), with the
same export and target, and print both per conversation and in total (tokens / forwards).

    python3 -m bench.decode.estimate_vs_eval --config smollm2-135m --export E --eval-json R.json \
        [--ids 12,40,...] [--set data.path=...] [--dtype fp32] --out bench/results/estimate_vs_eval.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from trainer.data.sources import build_source, split_data
from trainer.model.export import load_drafter
from trainer.run.heldout import score_batch
from trainer.runspec.config import load_config
from trainer.target_model.capture import load_capture_target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--export", required=True)
    parser.add_argument(
        "--eval-json", type=Path, required=True, help="an `eval --json` report of these prompts"
    )
    parser.add_argument("--ids", help="held-out record indices, comma-separated (default: the run's first N)")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    report = json.loads(args.eval_json.read_text())
    rows = report["per_prompt"]
    ids = [int(i) for i in args.ids.split(",")] if args.ids else split_data(cfg).eval_ids[: len(rows)]
    device, dtype = torch.device("cpu"), torch.float32 if args.dtype == "fp32" else torch.bfloat16
    assert cfg.drafter.target_layer_ids is not None
    target = load_capture_target(
        cfg.target.path, cfg.drafter.target_layer_ids, 0, device, dtype, keep_head=True
    )
    model = target.body  # the embedding the drafter shares
    drafter = load_drafter(args.export, model.embed_tokens.weight.detach(), target.lm_head.weight.detach())
    drafter = drafter.to(dtype=dtype).eval()
    source = build_source(cfg, device, int(model.embed_tokens.weight.shape[0]))
    out, walk_tokens, walk_forwards, eval_tokens, eval_forwards = [], 0, 0, 0, 0
    for j, row in zip(ids, rows, strict=False):
        input_ids, loss_mask = source.get(j)
        batch = target.capture_with_greedy(input_ids[None], loss_mask[None], 0)
        sums = score_batch(drafter, batch, cfg.optim.anchors)
        verify = row["target_forwards"] - 1  # the prefill apart
        out.append(
            {
                "id": j,
                "answer_tokens": int(loss_mask.sum()),
                "walk": sums.walk_tokens / max(sums.walk_forwards, 1),
                "eval": row["accept_len"],
                "eval_new_tokens": row["new_tokens"],
            }
        )
        walk_tokens, walk_forwards = walk_tokens + sums.walk_tokens, walk_forwards + sums.walk_forwards
        eval_tokens, eval_forwards = eval_tokens + row["accept_len"] * verify, eval_forwards + verify
        print(
            f"{j:6d}  walk {out[-1]['walk']:.3f}  eval {row['accept_len']:.3f}  ({row['new_tokens']} tokens)"
        )
    total = {"walk": walk_tokens / max(walk_forwards, 1), "eval": eval_tokens / max(eval_forwards, 1)}
    total["walk_over_eval"] = total["walk"] / total["eval"]
    print(f"total: walk {total['walk']:.3f}, eval {total['eval']:.3f}, ratio {total['walk_over_eval']:.3f}")
    args.out.write_text(json.dumps({"total": total, "conversations": out, "dtype": args.dtype}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
