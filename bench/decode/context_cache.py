"""`eval`'s drafter with and without the context cache, on the same prompts, in one run.

Before the cache, every block re-ran `fc`, `hidden_norm` and each layer's context keys and values over the
whole context (O(context) work per block, the same result each time); now each position is projected once
per sequence (`trainer.model.drafter.ContextCache`). Both proposers go through `eval`'s own loop
(`trainer.eval.evaluate.evaluate`, one target-only greedy decode per prompt as the baseline);
`WholeContextProposer` is the code `DFlashProposer` ran before. Printed: tau (equal up to rounding: the drafts
are the same computation), target forwards, time spent proposing per block, and the wall-clock speed-up over
greedy.

    .venv/bin/python -m bench.decode.context_cache --config smollm2-135m --export runs/smollm2-135m/run/export \
        --prompts heldout.jsonl --num-prompts 12 --max-new-tokens 384 --dtype fp32 --device cpu
    .venv/bin/python -m bench.decode.context_cache --tiny      # CPU dry run: a tiny target and drafter
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from bench.lib.roles import RESULTS, print_rows, write_result
from trainer.engine.target import stop_token_ids
from trainer.eval.evaluate import EvalReport, EvalSetup, evaluate, load_pieces
from trainer.eval.prompts import prompts_from_file
from trainer.eval.proposers import DFlashProposer, WholeContextProposer
from trainer.eval.speculative import SpecTarget
from trainer.model.drafter import DFlashDrafter


class Timed:
    """A proposer whose proposals are timed (synchronised on CUDA, so the GPU's work is counted)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.max_draft = inner, inner.name, inner.max_draft
        self.needs_features, self.seconds, self.calls = inner.needs_features, 0.0, 0

    def start(self) -> None:
        self.inner.start()

    def propose(self, ids: list[int], features: Tensor | None) -> list[int]:
        began = time.perf_counter()
        out = self.inner.propose(ids, features)
        if features is not None and features.device.type == "cuda":
            torch.cuda.synchronize(features.device)
        self.seconds += time.perf_counter() - began
        self.calls += 1
        return list(out)


def row(report: EvalReport, proposer: Timed) -> dict[str, Any]:
    return {
        "proposer": proposer.name,
        "tau": round(report.mean_accept_len, 3),
        "target forwards": report.target_forwards,
        "greedy forwards": report.baseline_forwards,
        "ms per proposal": round(1000 * proposer.seconds / max(proposer.calls, 1), 2),
        "proposing s": round(proposer.seconds, 2),
        "speed-up vs greedy": round(report.speedup, 3),
        "identical": f"{sum(r.identical for r in report.per_prompt)}/{report.prompts}",
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tiny", action="store_true", help="the tiny target and an untrained drafter (dry run)"
    )
    parser.add_argument("--config")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--export")
    parser.add_argument("--prompts", help='a JSONL of {"prompt"}, {"messages"} or {"input_ids"} records')
    parser.add_argument("--num-prompts", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--out", default=str(RESULTS / "context_cache.json"))
    args = parser.parse_args()
    if args.tiny:
        target, drafter, prompts, eos = tiny_pieces()
    else:
        if not (args.config and args.export and args.prompts):
            parser.error("--config, --export and --prompts (or --tiny)")
        from trainer.runspec.config import load_config
        from trainer.target_model.tokenizer import load_tokenizer

        cfg = load_config(args.config, args.overrides)
        setup = EvalSetup(args.export, cfg.target.path, cfg.run.seed, args.device, args.dtype)
        target, drafter = load_pieces(setup)
        tokenizer = load_tokenizer(cfg.target.path)
        prompts = prompts_from_file(args.prompts, tokenizer, cfg.data.chat_template_kwargs)[
            : args.num_prompts
        ]
        eos = stop_token_ids(tokenizer, target.model.generation_config)
    cached, whole = Timed(DFlashProposer(drafter)), Timed(WholeContextProposer(drafter))
    report = evaluate(target, cached, prompts, args.max_new_tokens, eos, baseline=whole)
    assert report.baseline is not None
    rows = [row(report, cached), row(report.baseline, whole)]
    context = sum(len(p) for p in prompts) / len(prompts)
    title = (
        f"eval's drafter, context cache against the whole context ({len(prompts)} prompts, mean prompt "
        f"{context:.0f} tokens, {args.max_new_tokens} new, {target.dtype}, {target.device})"
    )
    print_rows(title, list(rows[0]), rows)
    faster = whole.seconds / max(cached.seconds, 1e-9)
    print(
        f"proposing: {faster:.2f}x less time with the cache; wall speed-up over greedy {rows[1]['speed-up vs greedy']} -> {rows[0]['speed-up vs greedy']}"
    )
    path = write_result(
        Path(args.out),
        {
            "bench": "context_cache",
            "prompts": len(prompts),
            "mean_prompt_tokens": round(context, 1),
            "max_new_tokens": args.max_new_tokens,
            "dtype": str(target.dtype),
            "device": str(target.device),
            "rows": rows,
            "proposing_time_ratio": round(faster, 3),
        },
    )
    print(f"wrote {path}")
    return 0


def tiny_pieces() -> tuple[SpecTarget, DFlashDrafter, list[list[int]], None]:
    """The tiny embedded target and an untrained 1-layer drafter: the plumbing, not a figure."""
    from trainer.model.drafter import DrafterConfig
    from trainer.runspec.target_shapes import tiny_qwen3_config
    from trainer.target_model.tiny import build_embedded_target

    model = build_embedded_target("tiny", seed=0)
    cfg = DrafterConfig.from_target(tiny_qwen3_config(), 1, 8, 511, [2])
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg, model.model.embed_tokens.weight, model.lm_head.weight).eval()
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, 500, (3, 200), generator=gen).tolist()
    return SpecTarget(model, cfg.target_layer_ids), drafter, prompts, None


if __name__ == "__main__":
    raise SystemExit(main())
