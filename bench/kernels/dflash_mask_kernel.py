"""A Triton attention forward + backward specialised to the DFlash mask (issue 40 §3; opt-in, not the default).

The mask (trainer/model/attention.py) is known from `context_end` alone: query row q of block n = q // B sees
context keys j < context_end[b, n] and the B keys of its own block (at S + n*B), nothing else. flex_attention
reads that off a 128 x 128 block mask and runs its generic kernels; its backward reached 16% of an H200's peak
at qwen3-8b-b16 (BENCHMARKS.md 3.3, 4.0). This module walks the structure directly, FlashAttention-2 style
(online softmax, the log-sum-exp saved for the backward):

  forward, dQ   per query tile: context key tiles up to the tile's largest context end (the partial last
                tile masked per row), then the own-block keys (a tiny block-diagonal piece).
  dK, dV        per context key tile: only the query blocks whose context end passes the tile's start (a
                contiguous range when anchors are ascending, computed on the host: `context_row_ranges`);
                per block key tile: only the rows of those blocks.

Every (row, key) pair is visited by exactly one loop: context loops only let through keys below the row's
context end (<= S), block loops only keys >= S of the row's own block. Correctness never assumes the anchors
are sorted (the ranges are min/max over the blocks that see a tile); sorted anchors only make them tight.

Keys may be laid out [context S | blocks] or with flex's padded context (`flex_context_len`): `context_len`
says where the blocks start, and padding keys past every context end are never visited.

Runs on CUDA (compiled for the GPU) and on CPU tensors under TRITON_INTERPRET=1 (the tests). The flex path stays
the default and the fall-back; bench/kernels/dflash_attention.py measures this against it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class Tiles:
    """Tile sizes and launch settings. The GPU default is the set that compiles for sm90 (Triton 3.9, bf16,
    d 128) with no or almost no register spills (ptxas -v: forward 0, dQ 0, dK/dV 16 and 100 bytes), where
    the fused-attention tutorial's shapes spilled 0.3-3 KB; the bench sweeps alternatives on the GPU."""

    fwd_m: int = 128
    fwd_n: int = 64
    fwd_warps: int = 8
    fwd_stages: int = 3
    bwd_m: int = 64  # dK/dV: query rows per step against a key tile of bwd_n
    bwd_n: int = 64
    dq_m: int = 128  # dQ: a query tile of dq_m against key steps of dq_n
    dq_n: int = 32
    bwd_warps: int = 8
    bwd_stages: int = 3


GPU_TILES = Tiles()
INTERPRETER_TILES = Tiles(16, 16, 1, 1, 16, 16, 16, 16, 1, 1)  # small: the interpreter's cost is per element


def interpreted() -> bool:
    """True when Triton runs kernels in its CPU interpreter: when it was imported under TRITON_INTERPRET=1.

    Read off triton.language's own jitted functions, not the variable: they are decorated when triton is
    first imported, so setting it later leaves them compiled-only and an interpreted kernel fails inside.
    """
    return type(tl.max).__name__ == "InterpretedFunction"


def default_tiles(device: torch.device) -> Tiles:
    return GPU_TILES if device.type == "cuda" and not interpreted() else INTERPRETER_TILES


# ---------------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------------


@triton.jit
def _visible(rows, keys, ends, context_len, num_rows, kv_len, block_size, CONTEXT: tl.constexpr):
    """The mask of one loop, elementwise on broadcast rows, keys and ends (either orientation). Context
    loops: keys below the row's context end (<= S: never a block key). Block loops: keys of the row's own
    block (keys >= S only ever reach them)."""
    if CONTEXT:
        seen = keys < ends
    else:
        same_block = ((keys - context_len) // block_size) == (rows // block_size)
        seen = same_block & (rows < num_rows) & (keys < kv_len)
    return seen


@triton.jit
def _own_keys(row_start, row_stop, context_len, block_size):
    """The key range holding the own blocks of rows [row_start, row_stop): whole blocks, so B need not
    divide the tile."""
    first = context_len + (row_start // block_size) * block_size
    last = context_len + ((row_stop - 1) // block_size + 1) * block_size
    return first, last


@triton.jit
def _fwd_keys(
    acc, l_i, m_i, q, k_ptr, v_ptr, stride_kn, stride_vn, key_start, key_stop, rows, ends,
    context_len, num_rows, kv_len, block_size, scale_log2,
    CONTEXT: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Online softmax over keys [key_start, key_stop) for one query tile (scores in log2 units)."""
    dims = tl.arange(0, HEAD_DIM)
    for start in range(key_start, key_stop, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        in_range = keys < kv_len
        k_t = tl.load(k_ptr + keys[None, :] * stride_kn + dims[:, None], mask=in_range[None, :], other=0.0)
        scores = tl.dot(q, k_t) * scale_log2
        seen = _visible(rows[:, None], keys[None, :], ends[:, None], context_len, num_rows, kv_len, block_size,
                        CONTEXT)  # fmt: skip
        scores = tl.where(seen, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + keys[:, None] * stride_vn + dims[None, :], mask=in_range[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _forward_kernel(
    Q, K, V, OUT, LSE, ENDS,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om, stride_eb,
    num_heads, group, num_rows, context_len, kv_len, block_size, scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """One query tile of one (batch, head): its context keys up to the tile's largest end, then its own blocks."""
    tile, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // num_heads, bh % num_heads
    kvh = h // group
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    real = rows < num_rows
    ends = tl.load(ENDS + b * stride_eb + rows // block_size, mask=real, other=0)
    q_ptr = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    q = tl.load(q_ptr + rows[:, None] * stride_qm + dims[None, :], mask=real[:, None], other=0.0)
    k_ptr = K + b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh
    v_ptr = V + b.to(tl.int64) * stride_vb + kvh.to(tl.int64) * stride_vh

    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # finite: a row with no key yet never makes NaN
    acc, l_i, m_i = _fwd_keys(
        acc, l_i, m_i, q, k_ptr, v_ptr, stride_kn, stride_vn, 0, tl.max(ends, 0), rows, ends,
        context_len, num_rows, kv_len, block_size, scale_log2, True, HEAD_DIM, BLOCK_N,
    )  # fmt: skip
    own_start, own_stop = _own_keys(tile * BLOCK_M, tl.minimum(tile * BLOCK_M + BLOCK_M, num_rows), context_len,
                                    block_size)  # fmt: skip
    acc, l_i, m_i = _fwd_keys(
        acc, l_i, m_i, q, k_ptr, v_ptr, stride_kn, stride_vn, own_start, own_stop, rows, ends,
        context_len, num_rows, kv_len, block_size, scale_log2, False, HEAD_DIM, BLOCK_N,
    )  # fmt: skip
    l_i = tl.where(l_i > 0, l_i, 1.0)  # padding rows past num_rows only
    o_ptr = OUT + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    tl.store(o_ptr + rows[:, None] * stride_om + dims[None, :], (acc / l_i[:, None]).to(OUT.dtype.element_ty),
             mask=real[:, None])  # fmt: skip
    tl.store(LSE + bh.to(tl.int64) * num_rows + rows, m_i + tl.log2(l_i), mask=real)


@triton.jit
def _dq_keys(
    dq, q, do, lse, delta, k_ptr, v_ptr, stride_kn, stride_vn, key_start, key_stop, rows, ends,
    context_len, num_rows, kv_len, block_size, scale_log2,
    CONTEXT: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dQ of one query tile from keys [key_start, key_stop): the probabilities recomputed from the saved LSE."""
    dims = tl.arange(0, HEAD_DIM)
    for start in range(key_start, key_stop, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        in_range = keys < kv_len
        k = tl.load(k_ptr + keys[:, None] * stride_kn + dims[None, :], mask=in_range[:, None], other=0.0)
        v_t = tl.load(v_ptr + keys[None, :] * stride_vn + dims[:, None], mask=in_range[None, :], other=0.0)
        seen = _visible(rows[:, None], keys[None, :], ends[:, None], context_len, num_rows, kv_len, block_size,
                        CONTEXT)  # fmt: skip
        p = tl.where(seen, tl.exp2(tl.dot(q, tl.trans(k)) * scale_log2 - lse[:, None]), 0.0)
        dp = tl.dot(do, v_t)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    return dq


@triton.jit
def _dq_kernel(
    Q, K, V, DO, DQ, LSE, DELTA, ENDS,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_eb,
    num_heads, group, num_rows, context_len, kv_len, block_size, scale, scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dQ of one query tile: the forward's two key loops again. q, dO and dQ share one (contiguous) layout."""
    tile, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // num_heads, bh % num_heads
    kvh = h // group
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    real = rows < num_rows
    ends = tl.load(ENDS + b * stride_eb + rows // block_size, mask=real, other=0)
    head = b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh  # a scalar: 2D 64-bit offsets held
    q = tl.load(Q + head + rows[:, None] * stride_qm + dims[None, :], mask=real[:, None], other=0.0)  # live
    do = tl.load(
        DO + head + rows[:, None] * stride_qm + dims[None, :], mask=real[:, None], other=0.0
    )  # spill
    lse = tl.load(LSE + bh.to(tl.int64) * num_rows + rows, mask=real, other=0.0)
    delta = tl.load(DELTA + bh.to(tl.int64) * num_rows + rows, mask=real, other=0.0)
    k_ptr = K + b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh
    v_ptr = V + b.to(tl.int64) * stride_vb + kvh.to(tl.int64) * stride_vh

    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    dq = _dq_keys(
        dq, q, do, lse, delta, k_ptr, v_ptr, stride_kn, stride_vn, 0, tl.max(ends, 0), rows, ends,
        context_len, num_rows, kv_len, block_size, scale_log2, True, HEAD_DIM, BLOCK_N,
    )  # fmt: skip
    own_start, own_stop = _own_keys(tile * BLOCK_M, tl.minimum(tile * BLOCK_M + BLOCK_M, num_rows), context_len,
                                    block_size)  # fmt: skip
    dq = _dq_keys(
        dq, q, do, lse, delta, k_ptr, v_ptr, stride_kn, stride_vn, own_start, own_stop, rows, ends,
        context_len, num_rows, kv_len, block_size, scale_log2, False, HEAD_DIM, BLOCK_N,
    )  # fmt: skip
    tile_offset = rows[:, None] * stride_qm + dims[None, :]
    tl.store(DQ + head + tile_offset, (dq * scale).to(DQ.dtype.element_ty), mask=real[:, None])


@triton.jit
def _dkdv_kernel(
    Q, K, V, DO, DK, DV, LSE, DELTA, ENDS, ROW_RANGES,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_eb, stride_rb,
    num_heads, group, num_rows, context_len, kv_len, block_size, scale, scale_log2,
    CONTEXT: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dK, dV of one key tile of one (batch, kv head), summed over the query heads that share it (GQA).

    CONTEXT: the tile is keys [i*BLOCK_N, ...) of the context, and only rows in ROW_RANGES[b, i] can see it.
    Otherwise it is keys S + i*BLOCK_N, ... of the blocks, seen by the rows of those blocks alone.
    k, v, dK and dV share one (contiguous) layout; so do q and dO.
    """
    tile, bh = tl.program_id(0), tl.program_id(1)
    num_kv_heads = num_heads // group
    b, kvh = bh // num_kv_heads, bh % num_kv_heads
    dims = tl.arange(0, HEAD_DIM)
    if CONTEXT:
        keys = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        key_stop = context_len
        row_start = tl.load(ROW_RANGES + b * stride_rb + 2 * tile)
        row_stop = tl.load(ROW_RANGES + b * stride_rb + 2 * tile + 1)
    else:
        keys = context_len + tile * BLOCK_N + tl.arange(0, BLOCK_N)
        key_stop = kv_len
        row_start = (tile * BLOCK_N // block_size) * block_size
        row_stop = tl.minimum((tl.minimum(tile * BLOCK_N + BLOCK_N, num_rows) - 1) // block_size * block_size
                              + block_size, num_rows)  # fmt: skip
    in_range = keys < key_stop
    head = b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh  # a scalar (see _dq_kernel)
    k = tl.load(K + head + keys[:, None] * stride_kn + dims[None, :], mask=in_range[:, None], other=0.0)
    v = tl.load(V + head + keys[:, None] * stride_kn + dims[None, :], mask=in_range[:, None], other=0.0)

    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for g in range(0, group):
        h = kvh * group + g
        q_ptr = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        do_ptr = DO + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        stats = (b * num_heads + h).to(tl.int64) * num_rows
        for start in range(row_start, row_stop, BLOCK_M):
            rows = start + tl.arange(0, BLOCK_M)
            real = rows < row_stop
            q_t = tl.load(q_ptr + rows[None, :] * stride_qm + dims[:, None], mask=real[None, :], other=0.0)
            do = tl.load(do_ptr + rows[:, None] * stride_qm + dims[None, :], mask=real[:, None], other=0.0)
            lse = tl.load(LSE + stats + rows, mask=real, other=0.0)
            delta = tl.load(DELTA + stats + rows, mask=real, other=0.0)
            ends = tl.load(ENDS + b * stride_eb + rows // block_size, mask=real, other=0)
            seen = _visible(rows[None, :], keys[:, None], ends[None, :], context_len, num_rows, kv_len,
                            block_size, CONTEXT) & real[None, :]  # fmt: skip
            p_t = tl.where(seen, tl.exp2(tl.dot(k, q_t) * scale_log2 - lse[None, :]), 0.0)  # keys x rows
            dv += tl.dot(p_t.to(do.dtype), do)
            ds_t = p_t * (tl.dot(v, tl.trans(do)) - delta[None, :])
            dk += tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t))
    tile_offset = keys[:, None] * stride_kn + dims[None, :]
    tl.store(DK + head + tile_offset, (dk * scale).to(DK.dtype.element_ty), mask=in_range[:, None])
    tl.store(DV + head + tile_offset, dv.to(DV.dtype.element_ty), mask=in_range[:, None])


# ---------------------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------------------


def context_row_ranges(context_end: Tensor, context_len: int, block_size: int, tile: int) -> Tensor:
    """(B, ceil(S / tile), 2) int32: per context key tile, the rows [start, stop) whose blocks see any of it.

    A block sees key tile i when its context end passes the tile's start. With valid anchors ascending and
    padding (context end 0) last, those blocks are one run, from the first that passes to the last valid one;
    taking the first and last block that pass keeps the range right for any order (only looser).
    """
    num_anchors = context_end.shape[1]
    starts = torch.arange(0, context_len, tile, device=context_end.device)
    sees = context_end.unsqueeze(1) > starts.view(1, -1, 1)  # (B, KT, N)
    anyone = sees.any(-1)
    first = sees.to(torch.int8).argmax(-1)
    last = num_anchors - sees.flip(-1).to(torch.int8).argmax(-1)
    ranges = torch.stack([first, last], dim=-1) * block_size
    return torch.where(anyone.unsqueeze(-1), ranges, 0).to(torch.int32).contiguous()


@dataclass(frozen=True)
class Shapes:
    """The sizes every kernel takes, read off and checked against the inputs once."""

    batch: int
    heads: int
    kv_heads: int
    rows: int
    kv_len: int
    head_dim: int

    @classmethod
    def check(
        cls, q: Tensor, k: Tensor, v: Tensor, context_end: Tensor, context_len: int, block_size: int
    ) -> Shapes:
        batch, heads, rows, head_dim = q.shape
        _, kv_heads, kv_len, _ = k.shape
        expected_kv = (batch, kv_heads, context_len + rows, head_dim)
        problems = []
        if tuple(k.shape) != expected_kv or tuple(v.shape) != expected_kv:
            problems.append(
                f"k and v must be {expected_kv} (context_len + rows keys), got {k.shape} and {v.shape}"
            )
        if heads % kv_heads:
            problems.append(f"query heads ({heads}) must be a multiple of kv heads ({kv_heads})")
        if tuple(context_end.shape) != (batch, rows // block_size) or rows % block_size:
            problems.append(f"context_end must be (batch, rows / block_size) = ({batch}, {rows / block_size}), "
                            f"got {tuple(context_end.shape)}")  # fmt: skip
        if head_dim < 16 or head_dim & (head_dim - 1):
            problems.append(f"head_dim must be a power of two >= 16, got {head_dim}")
        if problems:
            raise ValueError("dflash_attention: " + "; ".join(problems))
        return cls(batch, heads, kv_heads, rows, kv_len, head_dim)


def _forward(q: Tensor, k: Tensor, v: Tensor, ends: Tensor, s: Shapes, context_len: int, block_size: int,
             scale: float, tiles: Tiles) -> tuple[Tensor, Tensor]:  # fmt: skip
    out = torch.empty_like(q)
    lse = torch.empty(s.batch, s.heads, s.rows, device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(s.rows, tiles.fwd_m), s.batch * s.heads)
    _forward_kernel[grid](
        q, k, v, out, lse, ends, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
        ends.stride(0), s.heads, s.heads // s.kv_heads, s.rows, context_len, s.kv_len, block_size,
        scale * LOG2E, HEAD_DIM=s.head_dim, BLOCK_M=tiles.fwd_m, BLOCK_N=tiles.fwd_n,
        num_warps=tiles.fwd_warps, num_stages=tiles.fwd_stages,
    )  # fmt: skip
    return out, lse


def _backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, grad_out: Tensor, ends: Tensor,
              s: Shapes, context_len: int, block_size: int, scale: float,
              tiles: Tiles) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    grad_out = grad_out.contiguous()
    delta = (out.float() * grad_out.float()).sum(-1)  # rowsum(dO * O): one memory-bound pass, left to torch
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    group = s.heads // s.kv_heads
    common = dict(HEAD_DIM=s.head_dim, num_warps=tiles.bwd_warps, num_stages=tiles.bwd_stages)
    _dq_kernel[(triton.cdiv(s.rows, tiles.dq_m), s.batch * s.heads)](
        q, k, v, grad_out, dq, lse, delta, ends, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        ends.stride(0), s.heads, group, s.rows, context_len, s.kv_len, block_size, scale, scale * LOG2E,
        BLOCK_M=tiles.dq_m, BLOCK_N=tiles.dq_n, **common,
    )  # fmt: skip
    ranges = context_row_ranges(ends, context_len, block_size, tiles.bwd_n)
    for context, key_tiles in ((True, triton.cdiv(context_len, tiles.bwd_n)),
                               (False, triton.cdiv(s.rows, tiles.bwd_n))):  # fmt: skip
        _dkdv_kernel[(key_tiles, s.batch * s.kv_heads)](
            q, k, v, grad_out, dk, dv, lse, delta, ends, ranges, *q.stride()[:3], *k.stride()[:3],
            ends.stride(0), ranges.stride(0), s.heads, group, s.rows, context_len, s.kv_len, block_size,
            scale, scale * LOG2E, CONTEXT=context, BLOCK_M=tiles.bwd_m, BLOCK_N=tiles.bwd_n, **common,
        )  # fmt: skip
    return dq, dk, dv


class _DFlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, context_end: Tensor, context_len: int,
                block_size: int, scale: float, tiles: Tiles) -> Tensor:  # fmt: skip
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        shapes = Shapes.check(q, k, v, context_end, context_len, block_size)
        ends = context_end.clamp(min=0, max=context_len).to(torch.int32).contiguous()
        out, lse = _forward(q, k, v, ends, shapes, context_len, block_size, scale, tiles)
        ctx.save_for_backward(q, k, v, out, lse, ends)
        ctx.settings = (shapes, context_len, block_size, scale, tiles)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse, ends = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, out, lse, grad_out, ends, *ctx.settings)
        return dq, dk, dv, None, None, None, None, None


def dflash_attention(
    q: Tensor, k: Tensor, v: Tensor, context_end: Tensor, context_len: int, block_size: int,
    scale: float | None = None, tiles: Tiles | None = None,
) -> Tensor:  # fmt: skip
    """Attention under the DFlash mask. q (B, Hq, N*B, D); k, v (B, Hkv, context_len + N*B, D); context_end
    (B, N) from `trainer.model.attention.context_ends`. Differentiable in q, k and v; equals
    `sdpa_attention(q, k, v, dense_mask(...))` (scale 1/sqrt(D) unless given)."""
    if q.device.type != "cuda" and not interpreted():
        raise RuntimeError(
            "dflash_attention runs Triton kernels: it needs a CUDA device, or, for CPU tensors, Triton's "
            "interpreter: export TRITON_INTERPRET=1 before the process starts (it must be set before "
            "triton is first imported)"
        )
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    result: Tensor = _DFlashAttention.apply(
        q, k, v, context_end, context_len, block_size, scale, tiles or default_tiles(q.device)
    )
    return result
