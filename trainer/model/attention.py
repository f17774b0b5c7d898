"""The DFlash attention mask and the two kernels that apply it.

Queries are the N*B block tokens (anchor n, slot k at row n*B + k). Keys and values are laid out as
[context S | blocks N*B]. Query row q of anchor block n (anchor position a_n) may see:
  - context key j  iff  j < a_n            (strictly before the anchor: the anchor token is in the block)
  - block key of its own block n            (all B slots, both ways: the drafter is non-causal)
  - nothing else.
An invalid (padding) anchor sees only its own block, so no softmax row is empty (no NaN).

One predicate, `dflash_mask_mod`, defines the mask. The dense path evaluates it on broadcast index
tensors (exact, used on CPU with SDPA); the flex path's block mask (`dflash_block_mask`) lists which
128 x 128 tiles it touches, read off the structure, and hands flex the same predicate for the partial
tiles. Tests hold the block mask equal to `create_block_mask`'s evaluation of that predicate.

The compiled flex callable lives at module level and is created once per process. It must be warmed in
the main thread before any other thread exists (see REFERENCE.md section 4).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention

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

    `context_end` is captured as a tensor: a new step with new anchors reuses the compiled flex kernel.
    Block masks pad Q_LEN and KV_LEN to their tile size (128), so `q_idx // block_size` can exceed
    N - 1: it is clamped before indexing, and padded rows/columns only ever match padding.
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


FLEX_TILE = 128  # the block mask's tile (create_block_mask's default); flex kernel tiles divide it


def flex_context_len(seq_len: int) -> int:
    """The context length the flex path lays its keys out with: S rounded up to the tile (128).

    Keys become [context S | zeros | blocks Q]. With S + Q a multiple of the tile (Q = N*B usually is),
    flex compiles its IS_DIVISIBLE kernels (no bounds checks on any load) and every block's own keys
    start on a tile boundary. The zero keys are "context" no anchor reaches (every context end is < S),
    so the mask never lets them through. Measured at seed-b32 (S = 40000) on an H200: flex forward +
    backward 1.09x faster (bench/kernels/flex_sweep.py, row "pad kv").
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
        kernel_options=kernel_options,  # type: ignore[arg-type]  # checked keys: trainer.runspec.fields
    )


def dflash_block_mask(
    context_end: Tensor, context_len: int, block_size: int, tile: int = FLEX_TILE
) -> BlockMask:
    """The step's sparse block mask, read off the mask's structure instead of evaluated pair by pair.

    `create_block_mask` evaluates the predicate at every (query, key) pair (Q x KV: 2.4e9 at seed-b32)
    and, compiled, that one kernel was 150-200 s of a cold qwen3-8b-b16 warm-up on an H200, on one CPU
    core (bench/cache/cold_compile.py). The DFlash mask needs no evaluation. For query tile i (rows
    [i*tile, (i+1)*tile)) and key tile j:
      - its context keys [j*tile, min((j+1)*tile, S)) are all visible to every row when they end at or
        before the smallest context end of the tile's rows, and some are visible to some row when they
        start before the largest;
      - its block keys (at S + n*B for block n) are visible to a row of block n only: some are visible
        when the blocks of the tile's rows reach into them, all when the tile's rows are one block whose
        keys cover the key tile.
    A tile is full when every pair is visible, partial when some is (flex applies `dflash_mask_mod`
    there), else skipped. Rows and keys past Q_LEN and KV_LEN (the last tile's padding) see nothing, so a
    padded tile is never full: as in `create_block_mask`, whose result this equals block for block
    (tests/trainer/model/test_mask.py). A few small eager ops; nothing to compile.
    """
    batch, num_anchors = context_end.shape
    device = context_end.device
    q_len = num_anchors * block_size
    kv_len = context_len + q_len
    q_tiles, kv_tiles = -(-q_len // tile), -(-kv_len // tile)

    rows = torch.arange(q_tiles * tile, device=device)
    ends = context_end[:, (rows // block_size).clamp(max=num_anchors - 1)].view(batch, q_tiles, tile)
    real_row = (rows < q_len).view(q_tiles, tile)  # padding rows see nothing
    ends_min = ends.masked_fill(~real_row, kv_len).amin(-1).unsqueeze(-1)  # (B, QT, 1)
    ends_max = ends.masked_fill(~real_row, 0).amax(-1).unsqueeze(-1)

    key_start = torch.arange(kv_tiles, device=device) * tile  # (KT,)
    key_stop = (key_start + tile).clamp(max=kv_len)  # padding keys are seen by no row
    has_context = key_start < context_len
    context_some = has_context & (key_start < ends_max)  # (B, QT, KT)
    context_all = ~has_context | (key_stop.clamp(max=context_len) <= ends_min)

    tile_start = torch.arange(q_tiles, device=device) * tile
    first_block = tile_start // block_size
    last_block = ((tile_start + tile).clamp(max=q_len) - 1) // block_size
    own_start = (context_len + first_block * block_size).unsqueeze(-1)  # (QT, 1): the rows' block keys
    own_stop = (context_len + (last_block + 1) * block_size).unsqueeze(-1)
    blocks_start = key_start.clamp(min=context_len)  # (KT,): the key tile's block keys
    has_blocks = blocks_start < key_stop
    blocks_some = has_blocks & (own_start < key_stop) & (blocks_start < own_stop)  # (QT, KT)
    one_block = (first_block == last_block).unsqueeze(-1)
    blocks_all = ~has_blocks | (one_block & (own_start <= blocks_start) & (key_stop <= own_stop))
    no_padding = real_row.all(-1).unsqueeze(-1) & (key_start + tile <= kv_len)  # (QT, KT)

    full = context_all & blocks_all & no_padding
    partial = (context_some | blocks_some) & ~full
    kv_num, kv_indices = _ordered_blocks(partial.unsqueeze(1))
    full_num, full_indices = _ordered_blocks(full.unsqueeze(1))
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_indices,
        full_num,
        full_indices,
        BLOCK_SIZE=(tile, tile),
        mask_mod=dflash_mask_mod(context_end, context_len, block_size),
        seq_lengths=(q_len, kv_len),
    )


def _ordered_blocks(dense: Tensor) -> tuple[Tensor, Tensor]:
    """(..., KT) bool -> per row the count of True tiles and their indices first, ascending (int32)."""
    as_int = dense.to(torch.int32)
    order = torch.argsort(as_int, dim=-1, descending=True, stable=True)
    return as_int.sum(-1).to(torch.int32), order.to(torch.int32)


# Compiled once per process, at import, with a stable name; shapes are static per run (dynamic=False),
# so a run compiles it exactly once (per device/shape) and a warm Inductor cache serves it.
compiled_flex_attention = torch.compile(dflash_flex_attention, dynamic=False)
