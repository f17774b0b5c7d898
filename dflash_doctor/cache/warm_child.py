"""Compile what training will compile, in this one process, main thread, and report the counters.

Runs inside the audited interpreter (`python path/to/warm_child.py ...`), which may not have
dflash-doctor installed: it needs only the standard library and torch, and prints one JSON line
prefixed with RESULT_PREFIX. With `--config`, the trainer's own warm-up (`trainer.run.warmup.warm_up`)
is used when it can be imported; otherwise compiled flex_attention with the DFlash block mask (context
strictly before the anchor, own block both ways; the mask built eagerly) at the given shapes, forward
(+ backward on CUDA: CPU flex has no backward).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

RESULT_PREFIX = "DFLASH_WARM_RESULT "


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--anchors", type=int, default=8)
    parser.add_argument("--block", type=int, default=16)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--backward", choices=["auto", "yes", "no"], default="auto")
    parser.add_argument("--config", default=None, help="a trainer run.toml")
    parser.add_argument("--project-root", default=None, help="folder holding the `trainer` package")
    parser.add_argument(
        "--trainer-device",
        action="append",
        default=[],
        help="with --config: warm on this device (repeatable, e.g. cuda:1); Inductor keys graphs by device index",
    )
    return parser.parse_args(argv)


def dflash_mask_mod(anchor_positions: Any, context: int, block: int) -> Any:
    """Query i belongs to block i // block; it sees context keys strictly before its anchor and the
    keys of its own block. Indices past the last anchor (Q_LEN padding) are clamped, not indexed."""
    import torch

    last = anchor_positions.numel() - 1

    def dflash_mask(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        own = torch.clamp(q_idx // block, max=last)
        in_context = kv_idx < context
        sees_context = in_context & (kv_idx < anchor_positions[own])
        sees_block = ~in_context & ((kv_idx - context) // block == own)
        return sees_context | sees_block

    return dflash_mask


def counters_snapshot() -> dict[str, dict[str, int]]:
    from torch._dynamo.utils import counters

    return {group: dict(counters[group]) for group in ("inductor", "aot_autograd")}


def warm_flex(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
        torch._dynamo.config.fail_on_recompile_limit_hit = True  # never fall back to dense silently
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    backward = args.backward == "yes" or (args.backward == "auto" and cuda)
    dtype = torch.bfloat16 if cuda else torch.float32
    generator = torch.Generator().manual_seed(0)
    positions = torch.randperm(args.context - 1, generator=generator)[: args.anchors].sort().values + 1
    anchors = positions.to(device)
    q_len = args.anchors * args.block
    kv_len = args.context + q_len
    q = torch.randn(1, args.heads, q_len, args.head_dim, device=device, dtype=dtype, requires_grad=backward)
    k = torch.randn(
        1, args.kv_heads, kv_len, args.head_dim, device=device, dtype=dtype, requires_grad=backward
    )
    v = torch.randn(
        1, args.kv_heads, kv_len, args.head_dim, device=device, dtype=dtype, requires_grad=backward
    )
    compiled_flex = torch.compile(flex_attention, dynamic=False)
    # The block mask eagerly: the trainer builds its own without compiling (trainer.model.attention), so a
    # compiled create_block_mask here would only warm a graph no run uses (and cost minutes at b16's shapes).
    mask = create_block_mask(
        dflash_mask_mod(anchors, args.context, args.block), 1, None, q_len, kv_len, device=device
    )

    def step() -> None:
        out = compiled_flex(q, k, v, block_mask=mask, enable_gqa=args.heads != args.kv_heads)
        if backward:
            out.float().sum().backward()
        if cuda:
            torch.cuda.synchronize()

    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    start = time.perf_counter()
    step()
    second = time.perf_counter() - start
    return {
        "what": "flex_attention (DFlash block mask, built eagerly)",
        "shapes": {
            "heads": args.heads,
            "head_dim": args.head_dim,
            "kv_heads": args.kv_heads,
            "anchors": args.anchors,
            "block": args.block,
            "context": args.context,
            "q_len": q_len,
            "kv_len": kv_len,
            "dtype": str(dtype).removeprefix("torch."),
        },
        "backward": backward,
        "first_call_seconds": round(first, 4),
        "second_call_seconds": round(second, 4),
    }


def warm_trainer(args: argparse.Namespace) -> dict[str, Any] | None:
    """The trainer's own warm-up, when this environment has it; None to fall back to flex."""
    if args.project_root:
        sys.path.insert(0, args.project_root)
    try:
        from trainer.api import warm_up
        from trainer.runspec.config import load_config
    except ImportError:
        return None
    start = time.perf_counter()
    config = load_config(args.config)
    # One device after another in this one thread: never two compiles at once.
    stats = [warm_up(config, device) for device in (args.trainer_device or [None])]
    return {
        "what": "trainer.run.warmup.warm_up",
        "devices": args.trainer_device or ["config default"],
        "stats": stats if len(stats) > 1 else stats[0],
        "first_call_seconds": round(time.perf_counter() - start, 4),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import torch

    result = warm_trainer(args) if args.config else None
    if result is None:
        result = warm_flex(args)
    result["counters"] = counters_snapshot()
    result["torch"] = torch.__version__
    result["device"] = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
