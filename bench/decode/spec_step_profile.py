"""Where a speculative step's time goes, at a fixed batch: each part of it captured as its own CUDA graph and
replayed (the wall time a server's step pays), beside the kernels each part launches (counted in one eager run
under torch.profiler). At a 135M target's shapes a decode step is bound by kernel launches, not arithmetic: the
figures say how much of the speed-up tau promises the drafter's forward, the block-wide verify and the
bookkeeping take back (issue 56: "what bounds it").

Parts, each for `--batch` rows seated with real prompts (the first of `--prompts`, rendered as `eval` renders them):
- decode       target-only greedy's step: one token per row through the target, the next token chosen
- verify       the target over a block of B tokens per row (the forward and the argmax a verify needs)
- propose      the drafter's block: its layers over B tokens per row attending its context cache, its head
- context      the drafter's context for B verified positions (fc, hidden_norm, every layer's K/V)
- spec_dflash  the whole speculative step with the drafter (propose + verify + accept + context)
- spec_ngram   the whole speculative step with prompt lookup

    python -m bench.decode.spec_step_profile --config smollm2-135m --export runs/s22/export \
        --prompts runs/smollm2-135m/prompts/humaneval.jsonl --batch 1 --out bench/results/spec_step.json

On a CPU the parts run eagerly (no graphs): the kernel counts are the same ops, the times are not a GPU's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainer.engine.decoder import KVDecoder
from trainer.engine.drafting import DrafterProposer, LookupProposer
from trainer.engine.graphs import StepGraphs
from trainer.engine.speculative import SpeculativeDecoder
from trainer.engine.target import stop_token_ids
from trainer.eval.evaluate import EvalSetup, load_pieces
from trainer.eval.prompts import labelled_prompts
from trainer.runspec.config import load_config
from trainer.target_model.tokenizer import load_tokenizer


def timed(
    device: torch.device,
    part: Callable[[], None],
    graphs: StepGraphs | None,
    state: list[torch.Tensor],
    key: str,
    steps: int,
) -> float:
    """Median wall milliseconds of `part` (replayed as a graph on CUDA, eager elsewhere), state put back."""
    saved = [t.clone() for t in state]
    run = (lambda: graphs.replay(key, part, state)) if graphs is not None else part
    run()  # capture (or warm up)
    samples = []
    for _ in range(steps):
        for tensor, before in zip(state, saved, strict=True):
            tensor.copy_(before)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        began = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        samples.append((time.perf_counter() - began) * 1000)
    for tensor, before in zip(state, saved, strict=True):
        tensor.copy_(before)
    return statistics.median(samples)


def kernels(device: torch.device, part: Callable[[], None], state: list[torch.Tensor]) -> int:
    """Kernels (GPU) or operators (CPU) one eager run of `part` launches."""
    from torch.profiler import ProfilerActivity, profile

    saved = [t.clone() for t in state]
    activities = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        part()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    for tensor, before in zip(state, saved, strict=True):
        tensor.copy_(before)
    events = prof.events()
    if device.type == "cuda":
        return sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    return sum(1 for e in events if e.cpu_parent is None)  # top-level operators


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--export", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    cfg = load_config(args.config, [], check_data=False)
    tokenizer = load_tokenizer(cfg.target.path)
    prompts = labelled_prompts(args.prompts, tokenizer, cfg.data.chat_template_kwargs).ids[: args.batch]
    target, drafter = load_pieces(EvalSetup(args.export, cfg.target.path, 0, args.device, args.dtype))
    target.close()
    model, device = target.model, target.device
    stops = stop_token_ids(tokenizer, model.generation_config)
    block = drafter.cfg.block_size
    max_len = max(map(len, prompts)) + 64 + block
    slots = len(prompts)
    rows: dict[str, dict[str, Any]] = {}

    def seated(kind: str) -> Any:
        layers = list(drafter.cfg.target_layer_ids) if kind == "dflash" else []
        decoder = KVDecoder(model, slots, max_len, capture_layers=layers)
        if kind == "dflash":
            spec: Any = SpeculativeDecoder(
                decoder, DrafterProposer(drafter, slots, decoder.max_len, decoder.exact_lengths)
            )
        elif kind == "ngram":
            spec = SpeculativeDecoder(
                decoder, LookupProposer(block - 1, 1, 4, slots, decoder.max_len, device)
            )
        else:
            spec = decoder
        spec.configure(64, stops, 0.0, 1.0)
        spec.start_rows(prompts, list(range(slots)), [0] * slots)
        return spec

    def measure(name: str, part: Callable[[], None], decoder: KVDecoder, state: list[torch.Tensor]) -> None:
        graphs = StepGraphs(device) if device.type == "cuda" else None
        with torch.inference_mode():
            ms = timed(device, part, graphs, state, name, args.steps)
            count = kernels(device, part, state)
        rows[name] = {"ms": round(ms, 4), "kernels": count}
        print(
            f"{name:<12} {ms:8.3f} ms  {count:6d} {'kernels' if device.type == 'cuda' else 'operators'}",
            flush=True,
        )

    plain = seated("target")
    plain_span = plain.bucket(
        int(plain.positions.max()) + 1
    )  # read here: nothing in a captured part may sync
    measure("decode", lambda: plain._step(plain_span), plain, plain.job_state())
    spec = seated("dflash")
    d = spec.decoder
    state = [*d.job_state(), spec.forwards, spec.drafted, spec.emitted]
    ids = torch.cat([d.tokens[:, None], torch.zeros((slots, block - 1), dtype=torch.long, device=device)], 1)

    span = d.bucket(int(d.positions.max()) + block)  # the SDPA path's attended length (the kernel's: 0)

    def verify() -> None:
        x, _ = d.forward_rows(ids, span)
        d.logits(x).argmax(-1)

    measure("verify", verify, d, state)
    measure("propose", lambda: spec.proposer.propose(d.tokens, d.positions, span), d, state)
    with torch.inference_mode():
        features = d.forward_rows(ids, span)[1]
    measure("context", lambda: spec.proposer.accept(features, d.positions, ids, ids[:, 0]), d, state)
    measure("spec_dflash", lambda: spec._step(span), d, state)
    lookup = seated("ngram")
    measure("spec_ngram", lambda: lookup._step(span), lookup.decoder,
            [*lookup.decoder.job_state(), lookup.forwards, lookup.drafted, lookup.emitted, *lookup.proposer.state()])  # fmt: skip
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(next(model.parameters()).dtype),
        "batch": slots,
        "block": block,
        "drafter_layers": drafter.cfg.num_hidden_layers,
        "target_layers": model.config.num_hidden_layers,
        "graphs": device.type == "cuda",
        "parts": rows,
    }
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
