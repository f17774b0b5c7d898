"""The DFlash training loss: decayed cross-entropy over block slots, computed in checkpointed chunks.

Slot k of the block anchored at position a predicts the token AT a + k (same position, no shift: the
slot's input is the mask token, its RoPE position is a + k). Slot 0 holds the real anchor token and is
never supervised; a slot whose position is >= S or off the loss mask is dropped, and so is every slot
of an invalid (padding) anchor. Weights decay with the slot: w_k = exp(-(k - 1) / gamma) for k >= 1,
and loss = sum(w * CE) / sum(w).

The LM head is the target's (frozen). Its logits for all N*B rows would be huge (512 anchors x 16 x
151936 vocab = 1.25B values per sample), so head + CE run over row chunks, and because the head is frozen
each chunk's gradient w.r.t. the hidden states is computed while its logits exist (the "fused linear
cross-entropy" trick): nothing is recomputed in backward, which only scales the kept (R, H) gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

# The published defaults (DFlash recipe). Other block sizes interpolate linearly between these points
# and extend the end segments' slopes beyond them (B/2 below 8; 7 + (B - 16)/3 above 16), floor 1.
_PUBLISHED_GAMMA = ((8, 4.0), (10, 5.0), (16, 7.0))


@dataclass
class LossOutput:
    loss: Tensor  # scalar: sum(w * CE) / sum(w)
    correct: Tensor  # (block_size,) float: correct predictions per slot (slot 0 always 0)
    counted: Tensor  # (block_size,) float: supervised predictions per slot
    accept_len_sum: Tensor  # scalar: sum over valid anchors of (1 + leading correct slots)
    anchors: Tensor  # scalar: number of valid anchors


def default_gamma(block_size: int) -> float:
    """Decay constant for a block size: 4 for 8, 5 for 10, 7 for 16; piecewise linear elsewhere."""
    low, mid, high = _PUBLISHED_GAMMA
    (x0, y0), (x1, y1) = (low, mid) if block_size <= mid[0] else (mid, high)
    gamma = y0 + (y1 - y0) * (block_size - x0) / (x1 - x0)
    return max(1.0, gamma)


def slot_weights(block_size: int, gamma: float, device: torch.device | str | None = None) -> Tensor:
    """(block_size,) float32: w_0 = 0 (the anchor slot), w_k = exp(-(k - 1) / gamma) for k >= 1."""
    k = torch.arange(block_size, dtype=torch.float32, device=device)
    weights = torch.exp(-(k - 1) / gamma)
    weights[0] = 0.0
    return weights


def block_targets(
    input_ids: Tensor, loss_mask: Tensor, anchors: Tensor, anchor_valid: Tensor, block_size: int
) -> tuple[Tensor, Tensor]:
    """Labels and supervision for every block slot.

    Returns labels (B, N, block) int64 = input_ids[b, anchor + k] (0 where past the end) and supervised
    (B, N, block) bool: slot k >= 1, position < S, on the loss mask, anchor valid.
    """
    seq_len = input_ids.shape[1]
    offsets = torch.arange(block_size, device=anchors.device)
    positions = anchors.unsqueeze(-1) + offsets  # (B, N, block)
    in_range = positions < seq_len
    safe = positions.clamp(max=seq_len - 1).flatten(1)  # (B, N*block)
    labels = torch.gather(input_ids, 1, safe).view_as(positions)
    on_mask = torch.gather(loss_mask.bool(), 1, safe).view_as(positions)
    supervised = in_range & on_mask & anchor_valid.unsqueeze(-1) & (offsets > 0)
    labels = torch.where(in_range, labels, torch.zeros_like(labels))
    return labels, supervised


def _head_and_ce(
    hidden: Tensor, lm_head_weight: Tensor, labels: Tensor, weights: Tensor
) -> tuple[Tensor, Tensor]:
    """One chunk, forward only: weighted CE sum (fp32) and per-row top-1 correctness."""
    logits = F.linear(hidden, lm_head_weight).float()
    ce = F.cross_entropy(logits, labels, reduction="none")
    correct = logits.argmax(dim=-1) == labels
    return (ce * weights).sum(), correct


def _head_and_ce_with_grad(
    hidden: Tensor, lm_head_weight: Tensor, labels: Tensor, weights: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """One chunk, forward AND its gradient: (weighted CE sum, correctness, d sum / d hidden).

    The head is frozen, so the only gradient is the hidden one: (softmax - onehot) * w @ W. Computing it
    here, while the chunk's logits exist, saves the recompute that activation checkpointing would do in
    backward (a third pass of the largest matmul of the step)."""
    logits = F.linear(hidden, lm_head_weight).float()
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    ce = (lse - logits.gather(1, labels.unsqueeze(1))).squeeze(1)
    correct = logits.argmax(dim=-1) == labels
    vocab = torch.arange(logits.shape[1], device=logits.device)
    is_label = vocab.unsqueeze(0) == labels.unsqueeze(1)
    grad_logits = (torch.exp(logits - lse) - is_label.float()) * weights.unsqueeze(1)
    grad_hidden = grad_logits.to(lm_head_weight.dtype) @ lm_head_weight
    return (ce * weights).sum(), correct, grad_hidden


_COMPILED: dict[str, Callable[..., tuple[Tensor, ...]]] = {}


def compiled_chunk(fn: Callable[..., tuple[Tensor, ...]]) -> Callable[..., tuple[Tensor, ...]]:
    """`fn` compiled once per process: the fp32 logits, log-softmax, CE and the softmax gradient fuse into
    a few kernels instead of several memory-bound passes over (chunk, vocab)."""
    if fn.__name__ not in _COMPILED:
        _COMPILED[fn.__name__] = torch.compile(fn, dynamic=False)
    return _COMPILED[fn.__name__]


def even_chunk(rows: int, chunk: int) -> int:
    """The chunk size that splits `rows` into equal parts (at most `chunk` each), so a compiled chunk
    function sees one shape and never recompiles for a ragged last chunk."""
    parts = max(1, -(-rows // max(1, chunk)))
    return -(-rows // parts)


def _compute_dtype(hidden: Tensor, lm_head_weight: Tensor) -> torch.dtype:
    """The matmul dtype: autocast's when it is on (bf16 on CUDA), else the hidden states' own."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return hidden.dtype


def _over_chunks(
    fn: Callable[..., tuple[Tensor, ...]],
    hidden: Tensor,
    lm_head_weight: Tensor,
    labels: Tensor,
    weights: Tensor,
    step: int,
) -> Iterator[tuple[slice, tuple[Tensor, ...]]]:
    """(rows, fn's outputs) for each chunk of `step` rows, in the matmul dtype with autocast off (the
    casts are explicit, so the compiled chunk function sees the same dtypes with or without autocast)."""
    dtype = _compute_dtype(hidden, lm_head_weight)
    with torch.autocast(hidden.device.type, enabled=False):
        weight = lm_head_weight.to(dtype)
        for start in range(0, hidden.shape[0], step):
            rows = slice(start, start + step)
            yield rows, fn(hidden[rows].to(dtype), weight, labels[rows], weights[rows])


class _ChunkedHeadCE(torch.autograd.Function):
    """sum(w * CE(hidden @ W^T)) with the gradient computed chunk by chunk during the forward pass."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        lm_head_weight: Tensor,
        labels: Tensor,
        weights: Tensor,
        step: int,
        compiled: bool,
    ) -> tuple[Tensor, Tensor]:
        fn = compiled_chunk(_head_and_ce_with_grad) if compiled else _head_and_ce_with_grad
        grad = torch.empty(hidden.shape, dtype=_compute_dtype(hidden, lm_head_weight), device=hidden.device)
        total = hidden.new_zeros((), dtype=torch.float32)
        correct = []
        for rows, (part, part_correct, part_grad) in _over_chunks(
            fn, hidden, lm_head_weight, labels, weights, step
        ):
            total = total + part
            correct.append(part_correct)
            grad[rows] = part_grad
        ctx.save_for_backward(grad)
        ctx.hidden_dtype = hidden.dtype
        all_correct = torch.cat(correct)
        ctx.mark_non_differentiable(all_correct)
        return total, all_correct

    @staticmethod
    def backward(ctx: Any, grad_total: Tensor, _grad_correct: Tensor | None) -> tuple[Tensor | None, ...]:
        (grad,) = ctx.saved_tensors
        return (grad.to(ctx.hidden_dtype) * grad_total, None, None, None, None, None)


def chunked_weighted_ce(
    hidden: Tensor,
    lm_head_weight: Tensor,
    labels: Tensor,
    weights: Tensor,
    chunk: int,
    compiled: bool = False,
) -> tuple[Tensor, Tensor]:
    """sum(weights * CE(hidden @ W^T, labels)) over rows, and per-row correctness, chunk rows at a time.

    hidden (R, H), labels (R,), weights (R,) float; W is frozen (never gets a gradient). Only one chunk's
    logits (chunk, V) exist at a time. When `hidden` needs a gradient, each chunk's gradient is computed
    in the same pass and kept (R, H): backward only scales it, so the head's logits are never recomputed.
    `compiled` uses the compiled chunk function (equal chunk sizes, so it compiles once).
    """
    if lm_head_weight.requires_grad:
        raise ValueError("chunked_weighted_ce: the LM head must be frozen (requires_grad=False)")
    step = even_chunk(hidden.shape[0], chunk) if compiled else chunk
    if torch.is_grad_enabled() and hidden.requires_grad:
        return _ChunkedHeadCE.apply(hidden, lm_head_weight, labels, weights, step, compiled)
    fn = compiled_chunk(_head_and_ce) if compiled else _head_and_ce
    total = hidden.new_zeros((), dtype=torch.float32)
    correct = []
    for _, (part, part_correct) in _over_chunks(fn, hidden, lm_head_weight, labels, weights, step):
        total = total + part
        correct.append(part_correct)
    return total, torch.cat(correct)


def dflash_loss(
    hidden: Tensor,
    lm_head_weight: Tensor,
    labels: Tensor,
    supervised: Tensor,
    anchor_valid: Tensor,
    gamma: float,
    chunk: int,
    compiled: bool = False,
) -> LossOutput:
    """The loss and its accuracy statistics from the drafter's final hidden states.

    hidden (B, N, block, H) after the final norm; labels/supervised (B, N, block) from `block_targets`.
    Slot 0 is sliced away before the LM head (it is never supervised): 1/block of the head's work saved.
    """
    batch, num_anchors, block_size, width = hidden.shape
    weights = slot_weights(block_size, gamma, hidden.device)[1:] * supervised[..., 1:]  # (B, N, block-1)
    rows = hidden[:, :, 1:, :].reshape(-1, width)  # (B*N*(block-1), H)
    weighted_sum, correct_rows = chunked_weighted_ce(
        rows, lm_head_weight, labels[..., 1:].reshape(-1), weights.reshape(-1), chunk, compiled
    )
    loss = weighted_sum / weights.sum().clamp(min=1e-12)

    with torch.no_grad():
        hit = correct_rows.view(batch, num_anchors, block_size - 1) & supervised[..., 1:]
        zero = hit.new_zeros(()).float().view(1)
        correct = torch.cat([zero, hit.float().sum(dim=(0, 1))])
        counted = torch.cat([zero, supervised[..., 1:].float().sum(dim=(0, 1))])
        leading = hit.long().cumprod(dim=-1).sum(dim=-1)  # (B, N): correct slots before the first miss
        accept_len_sum = ((1 + leading) * anchor_valid).sum().float()
        valid_anchors = anchor_valid.sum().float()
    return LossOutput(loss, correct, counted, accept_len_sum, valid_anchors)


def expected_acceptance_length(correct: Tensor, counted: Tensor) -> float:
    """Acceptance length implied by per-slot accuracies: 1 + sum_k prod_{j<=k} acc_j (slots 1..B-1).

    A cheaper, aggregate estimate than `LossOutput.accept_len_sum / anchors` (which counts leading
    correct slots per anchor exactly); both are logged.
    """
    acc = (correct[1:] / counted[1:].clamp(min=1)).double()
    return float(1 + torch.cumprod(acc, 0).sum()) if acc.numel() else 1.0


__all__ = [
    "LossOutput",
    "block_targets",
    "chunked_weighted_ce",
    "default_gamma",
    "dflash_loss",
    "expected_acceptance_length",
    "slot_weights",
]
