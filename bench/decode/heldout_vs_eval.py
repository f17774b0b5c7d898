"""Does the held-out estimate predict real speculative decoding? Both on the same prompts and tokens.

For each held-out prompt of a run (`--config`), the target decodes greedily (`trainer.eval.speculative.greedy_decode`);
that greedy sequence is then scored the way training scores held-out batches (`trainer.run.heldout.score_batch`,
every position an anchor), and decoded again speculatively with the run's export (`trainer.eval.evaluate`). On data
the target wrote greedily the estimate's rule is exact per anchor; the two figures differ only in which
anchors they average over (every position, against the positions where a verify forward starts).

    .venv/bin/python -m bench.decode.heldout_vs_eval --config tiny-cpu --export runs/tiny-cpu/export

Writes bench/results/heldout_vs_eval.json.
"""

from __future__ import annotations

import argparse
import sys

import torch

from bench.lib.roles import RESULTS, print_rows, write_result
from trainer.eval.evaluate import EvalSetup, evaluate, load_pieces
from trainer.eval.prompts import heldout_prompts
from trainer.eval.speculative import greedy_decode
from trainer.run.heldout import HeldoutSums, score_batch
from trainer.runspec.config import load_config
from trainer.target_model.capture import CaptureTarget
from trainer.target_model.tiny import build_embedded_target

COLUMNS = (
    "prompts",
    "new_tokens",
    "estimate_vs_target",
    "estimate_vs_labels",
    "eval_accept_len",
    "identical",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny-cpu")
    parser.add_argument("--export", required=True)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    cfg = load_config(args.config)
    prompts = heldout_prompts(cfg, args.prompt_len, args.prompts)
    target, drafter = load_pieces(EvalSetup(args.export, cfg.target.path, cfg.run.seed, "cpu"))
    assert cfg.drafter.target_layer_ids is not None
    capture = CaptureTarget(build_embedded_target(cfg.target.path, cfg.run.seed), cfg.drafter.target_layer_ids,
                            keep_head=True)  # fmt: skip
    estimate = HeldoutSums()
    for j, prompt in enumerate(prompts):
        sequence = prompt + greedy_decode(target, prompt, args.max_new_tokens, None).tokens
        ids = torch.tensor([sequence])
        mask = torch.arange(len(sequence)).unsqueeze(0) >= len(prompt)  # the generated part is scored
        batch = capture.capture_with_greedy(ids, mask, j)
        batch.hidden = batch.hidden.clone()  # out of inference mode
        with torch.no_grad():
            estimate.add(score_batch(drafter, batch, len(sequence)))
    report = evaluate(target, drafter, prompts, args.max_new_tokens)
    row = {
        "prompts": len(prompts), "new_tokens": report.new_tokens,
        "estimate_vs_target": round(estimate.accept_len_target, 3),
        "estimate_vs_labels": round(estimate.accept_len_labels, 3),
        "eval_accept_len": round(report.mean_accept_len, 3), "identical": report.identical,
    }  # fmt: skip
    print_rows(f"held-out estimate against real decoding: {args.config}", COLUMNS, [row])
    print(f"wrote {write_result(RESULTS / 'heldout_vs_eval.json', {'args': vars(args), 'row': row})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
