"""Anchor sampling: which positions of each sequence start a draft block this step.

A position p is a valid anchor when the anchor token and the token after it are both supervised
(`loss_mask[p] and loss_mask[p + 1]`): then slot 1 of the block, at least, has a label. Slots that run
past the sequence end or off the loss mask are dropped by the loss, not here.

N is fixed per run (static shapes: nothing recompiles). A sequence with fewer valid positions than N is
padded with invalid entries (anchor 0, valid False); the mask gives them only their own block and the
loss ignores them. Valid anchors come first, in ascending position order: neighbouring query tiles then
share context extents, which keeps the flex block mask sparse.
"""

from __future__ import annotations

import torch
from torch import Tensor


def valid_anchor_positions(loss_mask: Tensor) -> Tensor:
    """(B, S) bool: True where a block may start (anchor and next token supervised)."""
    loss_mask = loss_mask.bool()
    valid = torch.zeros_like(loss_mask)
    valid[:, :-1] = loss_mask[:, :-1] & loss_mask[:, 1:]
    return valid


def sample_anchors(
    loss_mask: Tensor, num_anchors: int, block_size: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Sample N anchors per sequence among valid positions, without replacement.

    Returns anchors (B, N) int64 and valid (B, N) bool, on `loss_mask`'s device. Deterministic for a
    given generator state (the random draw happens on the generator's device).
    """
    if num_anchors < 1:
        raise ValueError(f"num_anchors must be >= 1, got {num_anchors}")
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2 (slot 0 is never supervised), got {block_size}")
    batch, seq_len = loss_mask.shape
    device = loss_mask.device
    candidates = valid_anchor_positions(loss_mask)  # (B, S)

    # Random keys in [0, 1) for valid positions, 2 for invalid ones; the N smallest keys are a uniform
    # sample without replacement among the valid positions, topped up with invalid ones.
    keys = torch.rand(batch, seq_len, generator=generator, device=generator.device).to(device)
    keys = torch.where(candidates, keys, torch.full_like(keys, 2.0))
    take = min(num_anchors, seq_len)
    picked_keys, picked = torch.topk(keys, take, dim=1, largest=False)  # (B, take)
    picked_valid = picked_keys < 1.0

    # Order: valid anchors ascending by position, then padding.
    order_key = torch.where(picked_valid, picked, picked.new_full(picked.shape, seq_len))
    order_key, _ = torch.sort(order_key, dim=1)
    valid = order_key < seq_len
    anchors = torch.where(valid, order_key, torch.zeros_like(order_key))

    if take < num_anchors:  # shorter sequences than N: pad to the static N
        pad = num_anchors - take
        anchors = torch.cat([anchors, anchors.new_zeros(batch, pad)], dim=1)
        valid = torch.cat([valid, valid.new_zeros(batch, pad)], dim=1)
    return anchors.contiguous(), valid.contiguous()
