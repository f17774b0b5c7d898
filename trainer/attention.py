"""The DFlash attention mask and the two kernels that apply it.

Queries are the N*B block tokens (anchor n, slot k at row n*B + k). Keys and values are laid out as
[context S | blocks N*B]. Query row q of anchor block n (anchor position a_n) may see:
  - context key j  iff  j < a_n            (strictly before the anchor: the anchor token is in the block)
  - block key of its own block n            (all B slots, both ways: the drafter is non-causal)
  - nothing else.
An invalid (padding) anchor sees only its own block, so no softmax row is empty (no NaN).

One predicate, `dflash_mask_mod`, defines the mask. The dense path evaluates it on broadcast index
tensors (exact, used on CPU with SDPA); the flex path hands it to `create_block_mask`. Both are built
from the same closure, so they cannot disagree.

The compiled callables live at module level and are created once per process. They must be warmed in
the main thread before any other thread exists (see REFERENCE.md section 4).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


class FlexNotCompiledError(RuntimeError):
    """flex_attention was about to run outside torch.compile: the dense O(Q*KV) fall-back."""


def context_ends(anchors: Tensor, anchor_valid: Tensor) -> Tensor:
    """(B, N) int64: how many context keys each block sees: its anchor position if valid, else 0.

    Computed outside the compiled mask builder on purpose: a bool tensor loaded inside the mask kernel
    trips an Inductor CPU codegen bug in torch 2.13 (VecMask<int> vs VecMask<float>).
    """
    return torch.where(anchor_valid, anchors, torch.zeros_like(anchors)).contiguous()


def dflash_mask_mod(context_end: Tensor, context_len: int, block_size: int) -> MaskMod:
    """The mask predicate for one step's anchors (`context_end` from `context_ends`).

    `context_end` is captured as a tensor: a new step with new anchors reuses the compiled block-mask
    builder. `create_block_mask` pads Q_LEN and KV_LEN to its tile size (128), so `q_idx // block_size`
    can exceed N - 1: it is clamped before indexing, and padded rows/columns only ever match padding.
    Predicates are kept simple on purpose: the same closure runs in Inductor's CPU and Triton codegen.
    """
    num_anchors = context_end.shape[-1]

    def dflash_mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        q_block = q_idx // block_size
        sees_context = kv_idx < context_end[b, q_block.clamp(max=num_anchors - 1)]  # strictly before
        sees_own_block = (kv_idx - context_len) // block_size == q_block
        # torch.where, not `|`: the `|` form miscompiles in Inductor's CPU codegen (torch 2.13, B > 1).
        return torch.where(kv_idx < context_len, sees_context, sees_own_block)

    return dflash_mask


FLEX_TILE = 128  # create_block_mask's default block size; flex kernel tiles divide it


def flex_context_len(seq_len: int) -> int:
    """The context length the flex path lays its keys out with: S rounded up to the tile (128).

    Keys become [context S | zeros | blocks Q]. With S + Q a multiple of the tile (Q = N*B usually is),
    flex compiles its IS_DIVISIBLE kernels (no bounds checks on any load) and every block's own keys
    start on a tile boundary. The zero keys are "context" no anchor reaches (every context end is < S),
    so the mask never lets them through. Measured at seed-b32 (S = 40000) on an H200: flex forward +
    backward 1.09x faster (bench/flex_sweep.py, row "pad kv").
    """
    return -(-seq_len // FLEX_TILE) * FLEX_TILE


def keys_layout(context: Tensor, blocks: Tensor, mask: Tensor | BlockMask) -> Tensor:
    """Keys (or values) in the mask's layout: (B, Hkv, S, D) + (B, Hkv, Q, D) -> (B, Hkv, KV, D).

    The dense mask's layout is [context | blocks]; a block mask built over `flex_context_len(S)` context
    positions gets the zero keys between them (one concatenation either way).
    """
    parts = [context, blocks]
    if isinstance(mask, BlockMask):
        missing = mask.seq_lengths[1] - context.shape[2] - blocks.shape[2]
        if missing:
            parts.insert(1, context.new_zeros(*context.shape[:2], missing, context.shape[3]))
    return torch.cat(parts, dim=2)


def dense_mask(anchors: Tensor, anchor_valid: Tensor, context_len: int, block_size: int) -> Tensor:
    """The mask as a boolean tensor (B, 1, N*B, S + N*B): True = may attend. Exact; O(Q*KV) memory."""
    batch, num_anchors = anchors.shape
    q_len = num_anchors * block_size
    device = anchors.device
    mask_mod = dflash_mask_mod(context_ends(anchors, anchor_valid), context_len, block_size)
    b = torch.arange(batch, device=device).view(batch, 1, 1)
    q_idx = torch.arange(q_len, device=device).view(1, q_len, 1)
    kv_idx = torch.arange(context_len + q_len, device=device).view(1, 1, -1)
    zero = torch.zeros((), dtype=torch.long, device=device)
    return mask_mod(b, zero, q_idx, kv_idx).unsqueeze(1)


def attend(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | BlockMask, flex_options: dict[str, Any] | None = None
) -> Tensor:
    """The step's attention: compiled flex for a BlockMask, exact SDPA for a dense boolean mask.
    `flex_options` are flex_attention's `kernel_options` (e.g. {"USE_TMA": True} on Hopper).

    Layers receive the mask itself (not a closure), so a compiled decoder layer traces flex inline and
    guards on tensors only: the same graph serves every layer and every step.
    """
    if isinstance(mask, BlockMask):
        return compiled_flex_attention(q, k, v, mask, flex_options)
    return sdpa_attention(q, k, v, mask)


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Exact attention with a dense boolean mask. q (B, Hq, Q, D); k, v (B, Hkv, KV, D) -> (B, Hq, Q, D)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


# ---------------------------------------------------------------------------------------------------
# Compiled flex path (GPU training; CPU forward only: CPU flex has no backward).
# ---------------------------------------------------------------------------------------------------


def require_compiled(what: str) -> None:
    # Traced by Dynamo, `is_compiling()` is True and this branch vanishes from the graph. Run as plain
    # Python it means Dynamo fell back to eager (recompile limit hit, nested FX trace, disabled compile):
    # flex would then materialise the full score matrix and OOM at real sizes. Fail loudly instead.
    if not torch.compiler.is_compiling():
        raise FlexNotCompiledError(
            f"{what} ran outside torch.compile (Dynamo fell back to eager: recompile limit hit, "
            "error_on_nested_fx_trace=False, or compile disabled). The uncompiled path materialises the "
            "full score matrix. Keep shapes static, set torch._dynamo.config.fail_on_recompile_limit_hit "
            "= True, and warm up in the main thread before starting other threads."
        )


def dflash_flex_attention(
    q: Tensor, k: Tensor, v: Tensor, block_mask: BlockMask, kernel_options: dict[str, Any] | None = None
) -> Tensor:
    """flex_attention with the DFlash block mask; only ever run through `compiled_flex_attention`."""
    require_compiled("flex_attention")
    return flex_attention(
        q,
        k,
        v,
        block_mask=block_mask,
        enable_gqa=q.shape[1] != k.shape[1],
        kernel_options=kernel_options,
    )


def dflash_block_mask(context_end: Tensor, context_len: int, block_size: int) -> BlockMask:
    """The sparse block mask for one step; only ever run through `compiled_block_mask`."""
    require_compiled("create_block_mask")
    mask_mod = dflash_mask_mod(context_end, context_len, block_size)
    batch, q_len = context_end.shape[0], context_end.shape[1] * block_size
    return create_block_mask(mask_mod, batch, None, q_len, context_len + q_len, device=context_end.device)


# Compiled once per process, at import, with stable names; shapes are static per run (dynamic=False),
# so a run compiles each exactly once (per device/shape) and a warm Inductor cache serves it.
compiled_flex_attention = torch.compile(dflash_flex_attention, dynamic=False)
compiled_block_mask = torch.compile(dflash_block_mask, dynamic=False)
