"""Attention over a KV cache whose rows sit at their own lengths: a few query tokens per slot (one for a decode
step, a block for a speculative verify or a drafted block), every slot at its own length.

`F.scaled_dot_product_attention` over the cache attends every slot up to the longest row's length (a mask hides
the rest, but the kernel still reads it): under continuous batching the rows sit anywhere from their prompt's
end to the answer cap, so most of the K/V a step reads is padding. This Triton kernel stops each (slot, KV head)
at that slot's length, and reads its K/V once for all the query heads that share it (grouped-query attention)
and all the slot's query tokens. Being length-driven from a tensor, one captured CUDA graph serves every step.

A slot's `lengths[slot]` keys are its cache's first positions, its own query tokens' keys the last of them
(the step writes them before it attends). Query t of T sees keys `j < lengths - T + t + 1` (causal: the target
verifying a block, or decoding one token) or every key `j < lengths` (a drafted block sees itself both ways).

Where Triton cannot run (a CPU without the interpreter) the same attention is SDPA with a mask.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any

import torch
import torch.nn.functional as F

BLOCK_POSITIONS = 64  # K/V positions one iteration of the kernel loads


@functools.cache
def triton_available(device_type: str) -> bool:
    """Whether the Triton kernel can run on this device type (CUDA, or any device under TRITON_INTERPRET=1)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return device_type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def cached_attention_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        out_ptr,
        lengths_ptr,
        scale,
        stride_qs,
        stride_qt,
        stride_qh,
        stride_ks,
        stride_kh,
        stride_kt,
        stride_os,
        stride_ot,
        stride_oh,
        QUERIES: tl.constexpr,
        GROUP: tl.constexpr,
        ROWS_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK: tl.constexpr,
        CAUSAL: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        slot = tl.program_id(0)
        kv_head = tl.program_id(1)
        length = tl.load(lengths_ptr + slot)
        r = tl.arange(0, ROWS_PAD)  # row r: query token r // GROUP, query head r % GROUP of this KV head
        t = r // GROUP
        heads = kv_head * GROUP + r % GROUP
        real = r < QUERIES * GROUP
        d = tl.arange(0, HEAD_DIM)
        q = tl.load(
            q_ptr + slot * stride_qs + t[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
            mask=real[:, None],
            other=0.0,
        )
        limit = length - (QUERIES - 1 - t) * CAUSAL  # (ROWS_PAD,): the keys each row sees
        best = tl.full([ROWS_PAD], float("-inf"), dtype=tl.float32)
        total = tl.zeros([ROWS_PAD], dtype=tl.float32)
        acc = tl.zeros([ROWS_PAD, HEAD_DIM], dtype=tl.float32)
        base = slot * stride_ks + kv_head * stride_kh
        for start in range(0, length, BLOCK):
            j = start + tl.arange(0, BLOCK)
            inside = j < length
            where = base + j[:, None] * stride_kt + d[None, :]
            k = tl.load(k_ptr + where, mask=inside[:, None], other=0.0)
            v = tl.load(v_ptr + where, mask=inside[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (ROWS_PAD, BLOCK)
            scores = tl.where(j[None, :] < limit[:, None], scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=1))
            weights = tl.exp(scores - new_best[:, None])
            rescale = tl.exp(best - new_best)
            total = total * rescale + tl.sum(weights, axis=1)
            acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)
            best = new_best
        out = acc / total[:, None]
        tl.store(
            out_ptr + slot * stride_os + t[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=real[:, None],
        )

    return cached_attention_kernel


def cached_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    causal: bool = True,
    span: int | None = None,
) -> torch.Tensor:
    """Attention of T query tokens per slot over the slot's own first `lengths[slot]` cached positions.

    q: (slots, T, heads, head_dim); keys, values: the cache, (slots, kv_heads, max_len, head_dim); lengths:
    (slots,) int, each at least T (the queries' own keys are the last T). Returns (slots, T, heads, head_dim)
    in q's dtype. Where Triton cannot run, SDPA reads the first `span` positions under a mask (`span` at least
    the longest length: a fixed span keeps the shapes a captured graph needs; None reads the longest length,
    which asks the device for it)."""
    slots, queries, heads, head_dim = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    if not triton_available(q.device.type):
        return masked_attention(q, keys, values, lengths, scale, causal, span)
    q = q.contiguous()
    out = torch.empty_like(q)
    _kernel()[(slots, kv_heads)](
        q,
        keys,
        values,
        out,
        lengths,
        scale,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        keys.stride(0),
        keys.stride(1),
        keys.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        QUERIES=queries,
        GROUP=group,
        ROWS_PAD=max(16, 1 << math.ceil(math.log2(queries * group))),  # tl.dot's smallest tile
        HEAD_DIM=head_dim,
        BLOCK=BLOCK_POSITIONS,
        CAUSAL=int(causal),  # 1 or 0: an integer constexpr multiplies a tensor in every Triton version
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    return out


def decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor, scale: float
) -> torch.Tensor:
    """One query token per slot (a decode step): q (slots, heads, head_dim) -> (slots, heads, head_dim)."""
    return cached_attention(q[:, None], keys, values, lengths, scale)[:, 0]


def visible_keys(lengths: torch.Tensor, queries: int, span: int, causal: bool) -> torch.Tensor:
    """(slots, queries, span) bool: which of the first `span` cached positions each query token sees."""
    j = torch.arange(span, device=lengths.device)
    if causal:
        t = torch.arange(queries, device=lengths.device)
        limit = lengths[:, None] - queries + t[None] + 1  # (slots, queries)
    else:
        limit = lengths[:, None].expand(-1, queries)
    return j[None, None] < limit[:, :, None]


def masked_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    causal: bool = True,
    span: int | None = None,
) -> torch.Tensor:
    """The same attention by SDPA over the first `span` positions (default: the longest row's) with a mask: the
    reference the kernel is tested against, and the path where Triton cannot run."""
    slots, queries, heads, head_dim = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    span = int(lengths.max()) if span is None else span
    visible = visible_keys(lengths, queries, span, causal)  # (slots, T, span)
    # grouped-query attention without copying K/V: a KV head's query heads and tokens are its "rows"
    qg = q.permute(0, 2, 1, 3).reshape(slots, kv_heads, group * queries, head_dim)
    mask = visible[:, None, None].expand(-1, -1, group, -1, -1).reshape(slots, 1, group * queries, span)
    o = F.scaled_dot_product_attention(
        qg, keys[:, :, :span], values[:, :, :span], attn_mask=mask, scale=scale
    )
    return o.reshape(slots, heads, queries, head_dim).permute(0, 2, 1, 3)
