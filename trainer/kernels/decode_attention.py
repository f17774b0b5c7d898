"""Decode attention that reads each row's own K/V only: one query token per slot, every slot at its own length.

`F.scaled_dot_product_attention` over the cache attends every slot up to the longest row's length (a mask hides
the rest, but the kernel still reads it): under continuous batching the rows sit anywhere from their prompt's
end to the answer cap, so most of the K/V a step reads is padding. This Triton kernel stops each (slot, KV head)
at that slot's length, and reads its K/V once for all the query heads that share it (grouped-query attention).
Being length-driven from a tensor, one captured CUDA graph serves every step.

`decode_attention` falls back to SDPA with a mask where Triton cannot run (a CPU without the interpreter).
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
    def decode_attention_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        out_ptr,
        lengths_ptr,
        scale,
        stride_qs,
        stride_qh,
        stride_ks,
        stride_kh,
        stride_kt,
        stride_os,
        stride_oh,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        slot = tl.program_id(0)
        kv_head = tl.program_id(1)
        length = tl.load(lengths_ptr + slot)
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, HEAD_DIM)
        heads = kv_head * GROUP + g
        q = tl.load(
            q_ptr + slot * stride_qs + heads[:, None] * stride_qh + d[None, :],
            mask=(g < GROUP)[:, None],
            other=0.0,
        )
        best = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
        total = tl.zeros([GROUP_PAD], dtype=tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
        base = slot * stride_ks + kv_head * stride_kh
        for start in range(0, length, BLOCK):
            t = start + tl.arange(0, BLOCK)
            inside = t < length
            where = base + t[:, None] * stride_kt + d[None, :]
            k = tl.load(k_ptr + where, mask=inside[:, None], other=0.0)
            v = tl.load(v_ptr + where, mask=inside[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (GROUP_PAD, BLOCK)
            scores = tl.where(inside[None, :], scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=1))
            weights = tl.exp(scores - new_best[:, None])
            rescale = tl.exp(best - new_best)
            total = total * rescale + tl.sum(weights, axis=1)
            acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)
            best = new_best
        out = acc / total[:, None]
        tl.store(
            out_ptr + slot * stride_os + heads[:, None] * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=(g < GROUP)[:, None],
        )

    return decode_attention_kernel


def decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention of one query token per slot over its own first `lengths[slot]` cached positions.

    q: (slots, heads, head_dim); keys, values: the cache, (slots, kv_heads, max_len, head_dim); lengths:
    (slots,) int, each at least 1. Returns (slots, heads, head_dim) in q's dtype."""
    slots, heads, head_dim = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    if not triton_available(q.device.type):
        return _sdpa_reference(q, keys, values, lengths, scale)
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
        keys.stride(0),
        keys.stride(1),
        keys.stride(2),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        GROUP_PAD=max(16, 1 << math.ceil(math.log2(group))),  # tl.dot's smallest tile
        HEAD_DIM=head_dim,
        BLOCK=BLOCK_POSITIONS,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    return out


def _sdpa_reference(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor, scale: float
) -> torch.Tensor:
    """The same attention by SDPA over the longest row's length with a mask (what the kernel replaces)."""
    slots, heads, head_dim = q.shape
    kv_heads = keys.shape[1]
    span = int(lengths.max())
    visible = torch.arange(span, device=q.device)[None] < lengths[:, None]
    qg = q.reshape(slots, kv_heads, heads // kv_heads, head_dim)
    o = F.scaled_dot_product_attention(
        qg, keys[:, :, :span], values[:, :, :span], attn_mask=visible[:, None, None], scale=scale
    )
    return o.reshape(slots, heads, head_dim)
