"""The cost of the draft-verify loop: `dflash-doctor eval`'s decoding against target-only greedy decoding.

With random weights (target `random:qwen3-8b`, an untrained drafter at the config's shapes) the acceptance
length is ~1, so this measures the loop's overhead: a verify forward of B tokens plus a drafter forward,
per accepted token, against one single-token target forward. With a trained drafter (`--export`) it is the
real speed-up. Outputs must equal target-only greedy's: the row says whether they were bitwise identical,
how many prompts differed only by a near-tie flip (`ties`: bf16 rounding, see `trainer.eval.compare`) and how
many really differed (`different`: a bug, exit 1).

    python3 -m bench.decode.spec_decode --config qwen3-8b-b16 --prompts 8 --prompt-len 512 --max-new-tokens 256
    .venv/bin/python -m bench.decode.spec_decode --config tiny-cpu --prompts 2 --max-new-tokens 16   # CPU dry run
    .venv/bin/python -m bench.decode.spec_decode --config tiny-cpu --device cpu --dtype bf16 --prompts 16 \
        --prompt-len 32 --max-new-tokens 64 --tag cpu-bf16   # bf16 near-tie flips without a GPU

Writes bench/results/spec_decode[-<tag>].json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

from bench.lib.roles import RESULTS, device_name, print_rows, write_result
from trainer.eval.evaluate import EvalSetup, evaluate, load_pieces
from trainer.model.build import build_drafter
from trainer.model.device import resolve_device
from trainer.model.export import export_drafter
from trainer.runspec.config import load_config
from trainer.runspec.target_shapes import target_hf_config
from trainer.target_model.load import load_frozen_embeddings

COLUMNS = ("prompts", "new_tokens", "block", "accept_len", "target_forwards", "baseline_forwards",
           "tok_s", "baseline_tok_s", "speedup", "identical", "ties", "different", "dtype", "device")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="qwen3-8b-b16")
    parser.add_argument("--export", help="a trained drafter's export (default: an untrained one)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--dtype", default="auto", choices=("auto", "bf16", "fp32"), help="auto: bf16 on CUDA"
    )
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    cfg = load_config(args.config)
    device = resolve_device(args.device)
    export = args.export
    if export is None:  # an untrained drafter at the config's shapes, exported as a run would
        embed, head, _ = load_frozen_embeddings(cfg.target.path, cfg.run.seed, device)
        model = build_drafter(cfg, target_hf_config(cfg.target.path), embed, head, device)
        export = str(export_drafter(model, Path(tempfile.mkdtemp(prefix="spec-bench-")) / "export"))
        del model, embed, head
    target, drafter = load_pieces(EvalSetup(export, cfg.target.path, cfg.run.seed, args.device, args.dtype))
    vocab = drafter.cfg.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, vocab - 1, (args.prompt_len,), generator=gen).tolist() for _ in range(args.prompts)
    ]
    evaluate(target, drafter, prompts[:1], min(8, args.max_new_tokens))  # warm-up: kernels, allocator
    report = evaluate(target, drafter, prompts, args.max_new_tokens)
    row = {
        "prompts": report.prompts, "new_tokens": report.new_tokens, "block": report.block_size,
        "accept_len": round(report.mean_accept_len, 3), "target_forwards": report.target_forwards,
        "baseline_forwards": report.baseline_forwards, "tok_s": round(report.tok_s, 1),
        "baseline_tok_s": round(report.baseline_tok_s, 1), "speedup": round(report.speedup, 3),
        "identical": report.identical, "ties": report.ties, "different": report.differences,
        "dtype": report.dtype, "device": device_name(device),
    }  # fmt: skip
    print_rows(
        f"spec decode: {args.config}, prompt {args.prompt_len}, {args.max_new_tokens} new", COLUMNS, [row]
    )
    name = f"spec_decode{'-' + args.tag if args.tag else ''}.json"
    differing = [  # where each non-identical prompt parted from target-only greedy, and by how much
        {"prompt": number, **asdict(r.comparison)}
        for number, r in enumerate(report.per_prompt, 1)
        if not r.identical
    ]
    result = {"config": args.config, "args": vars(args), "row": row, "differing": differing}
    path = write_result(RESULTS / name, result)
    print(f"wrote {path}")
    return report.exit_code()


if __name__ == "__main__":
    sys.exit(main())
