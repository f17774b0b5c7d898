"""The attention inputs of one drafter layer at a recipe's exact shapes, and a forward/backward timer.

Shared by bench/kernels/flex_sweep.py and bench/kernels/dflash_attention.py so that both time the same
tensors: anchors from the trainer's `sample_anchors`, the trainer's block mask, its GQA layout (Hq x Q
against Hkv x (S + Q)) and, with `pad_kv`, its padded context (`flex_context_len`).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from bench.lib.flops import attended_pairs
from bench.lib.roles import Recipe
from trainer.model.anchors import sample_anchors
from trainer.model.attention import context_ends, dflash_block_mask

TILE = 128  # create_block_mask's default block size: kernel tiles must divide it


class Inputs:
    """q, k, v and the block mask at the recipe's shapes, the way a drafter layer hands them to flex."""

    def __init__(
        self,
        recipe: Recipe,
        device: torch.device,
        pad_kv: bool,
        dtype: torch.dtype,
        backward: bool | None = None,
    ) -> None:
        cfg, hf = recipe.cfg, recipe.hf_config
        batch, seq, block = recipe.batch, recipe.seq_len, cfg.drafter.block_size
        heads, kv_heads = int(hf.num_attention_heads), int(hf.num_key_value_heads)
        head_dim = int(getattr(hf, "head_dim", None) or hf.hidden_size // heads)
        gen = torch.Generator(device=device).manual_seed(0)
        loss_mask = torch.ones(batch, seq, dtype=torch.bool, device=device)
        anchors, valid = sample_anchors(loss_mask, cfg.optim.anchors, block, gen)
        self.pairs = attended_pairs(anchors, valid, block)
        q_len = cfg.optim.anchors * block
        self.context_len = math.ceil(seq / TILE) * TILE if pad_kv else seq
        kv_len = self.context_len + q_len
        self.density = self.pairs / (batch * q_len * (seq + q_len))
        self.context_end = context_ends(anchors, valid)
        self.block_mask = dflash_block_mask(self.context_end, self.context_len, block)

        def draw(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, device=device, generator=gen) * 0.5).to(dtype)

        q = draw(batch, heads, q_len, head_dim)
        k, v = draw(batch, kv_heads, seq + q_len, head_dim), draw(batch, kv_heads, seq + q_len, head_dim)
        if pad_kv:  # masked keys between the context and the blocks: the values never reach a softmax row
            k, v = (self._pad(t, seq, self.context_len - seq) for t in (k, v))
        self.backward = device.type == "cuda" if backward is None else backward  # CPU flex: a forward only
        self.q, self.k, self.v = (t.requires_grad_(self.backward) for t in (q, k, v))
        self.grad_out = draw(batch, heads, q_len, head_dim)
        self.fwd_flops = 4 * heads * head_dim * self.pairs
        self.bwd_flops = 2.5 * self.fwd_flops
        self.kv_len = kv_len

    @staticmethod
    def _pad(t: torch.Tensor, at: int, width: int) -> torch.Tensor:
        filler = t.new_zeros(*t.shape[:2], width, t.shape[-1])
        return torch.cat([t[:, :, :at], filler, t[:, :, at:]], dim=2).contiguous()

    def zero_grads(self) -> None:
        for t in (self.q, self.k, self.v):
            t.grad = None


def timed_step(forward: Any, inputs: Inputs, device: torch.device) -> tuple[torch.Tensor, float, float]:
    """(output, forward seconds, backward seconds) of one call: CUDA events on a GPU, the clock on CPU."""
    inputs.zero_grads()
    if device.type != "cuda":
        began = time.perf_counter()
        out = forward()
        middle = time.perf_counter()
        if inputs.backward:
            out.backward(inputs.grad_out)
        return out.detach(), middle - began, time.perf_counter() - middle
    start, middle, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    start.record()
    out = forward()
    middle.record()
    out.backward(inputs.grad_out)
    end.record()
    end.synchronize()
    return out.detach(), start.elapsed_time(middle) / 1e3, middle.elapsed_time(end) / 1e3
