"""The held-out estimate (the decoding walk) of one or more exports on named sets of conversations.

A run scores its own held-out share; this scores any export on any chat file, the way the run would: each
conversation captured by the target (its greedy token after every position), every supervised position an
anchor, each answer walked as greedy speculative decoding walks it (`trainer.run.heldout.score_batch`). Fed the
target's own greedy answers to an evaluation set's prompts (`data regenerate --prompts humaneval.jsonl
--max-new-tokens 128`), the figure predicts `eval`'s tau on those prompts at that length (BENCHMARKS 5.0: within
1-2% on the same conversations) at a fraction of its cost: one forward per conversation instead of one per
accepted block. Prints a table; writes JSON.

    python3 -m bench.decode.walk_estimate --config smollm2-135m --export A=runs/a/export --export B=runs/b/export \
        --set humaneval=answers/humaneval.jsonl --set chat=answers/chat.jsonl [--dtype bf16] --out walk.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from dflash_base.atomic import write_json_atomic
from trainer.data.order import make_padded_batch
from trainer.data.sources import build_source
from trainer.model.export import load_drafter
from trainer.run.heldout import HeldoutSums, score_batch
from trainer.runspec.config import load_config
from trainer.target_model.capture import load_capture_target


def named(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, path


def export_layer_ids(export: str) -> list[int]:
    """The target layers an export's drafter reads (its config's `dflash_config.target_layer_ids`)."""
    config = json.loads((Path(export) / "config.json").read_text())
    return [int(i) for i in config["dflash_config"]["target_layer_ids"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--override", action="append", default=[], help="a config --set, e.g. data.loops=cut")
    parser.add_argument("--export", type=named, action="append", required=True, help="NAME=EXPORT_DIR")
    parser.add_argument(
        "--set", dest="sets", type=named, action="append", required=True, help="NAME=CHAT.jsonl"
    )
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--batch", type=int, default=16, help="conversations captured at once")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    # the config's data file need not exist here: the sets are what is scored
    cfg = load_config(args.config, [f"data.path={json.dumps(args.sets[0][1])}", *args.override], split=False)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    layers = {name: export_layer_ids(path) for name, path in args.export}
    if len({tuple(ids) for ids in layers.values()}) != 1:
        parser.error(f"the exports capture different target layers (one capture serves them all): {layers}")
    target = load_capture_target(
        cfg.target.path, next(iter(layers.values())), 0, device, dtype, keep_head=True
    )
    embed, head = target.body.embed_tokens.weight.detach(), target.lm_head.weight.detach()
    vocab = int(embed.shape[0])
    drafters = {
        name: load_drafter(path, embed, head).to(device=device, dtype=dtype).eval()
        for name, path in args.export
    }
    results: dict[str, dict[str, dict[str, float]]] = {name: {} for name in drafters}
    for set_name, path in args.sets:
        source = build_source(cfg, device, vocab, path, f"--set {set_name}")
        ids = list(range(len(source)))
        began = time.perf_counter()
        sums = {name: HeldoutSums() for name in drafters}
        for start in range(0, len(ids), args.batch):
            input_ids, loss_mask = make_padded_batch(source, ids[start : start + args.batch], args.batch)
            batch = target.capture_with_greedy(input_ids.to(device), loss_mask.to(device), 0)
            with torch.no_grad():
                for name, drafter in drafters.items():
                    sums[name].add(score_batch(drafter, batch, cfg.optim.anchors))
        seconds = time.perf_counter() - began
        for name, total in sums.items():
            results[name][set_name] = {
                "walk_tau": round(total.accept_len_target, 4),
                "conversations": total.sequences,
                "walk_tokens": total.walk_tokens,
                "walk_forwards": total.walk_forwards,
            }
        print(f"{set_name}: {len(ids)} conversations, {len(drafters)} exports in {seconds:.1f} s")
    names = [name for name, _ in args.sets]
    print("export".ljust(24) + "".join(n.rjust(12) for n in names))
    for export, row in results.items():
        print(export.ljust(24) + "".join(f"{row[n]['walk_tau']:12.3f}" for n in names))
    write_json_atomic(args.out, {"config": args.config, "dtype": args.dtype, "walk": results})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
