"""Tiny drafters and batches for the model tests: CPU-fast, deterministic."""

from __future__ import annotations

import torch

from trainer.model.anchors import sample_anchors
from trainer.model.drafter import DFlashDrafter, DrafterConfig

VOCAB = 97
HIDDEN = 32


def tiny_config(
    block_size: int = 4, num_layers: int = 2, target_layer_ids: list[int] | None = None
) -> DrafterConfig:
    return DrafterConfig(
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        vocab_size=VOCAB,
        max_position_embeddings=256,
        block_size=block_size,
        target_layer_ids=target_layer_ids or [1, 2],
        mask_token_id=VOCAB - 1,
        num_target_layers=4,
    )


def frozen_weights(cfg: DrafterConfig, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen)
    head = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen) * 0.2
    return embed, head


def tiny_drafter(cfg: DrafterConfig | None = None, seed: int = 0, **kwargs: object) -> DFlashDrafter:
    cfg = cfg or tiny_config()
    torch.manual_seed(seed)
    embed, head = frozen_weights(cfg, seed)
    return DFlashDrafter(cfg, embed, head, **kwargs)  # type: ignore[arg-type]


def tiny_batch(
    cfg: DrafterConfig, batch: int = 2, seq_len: int = 24, num_anchors: int = 5, seed: int = 0
) -> dict[str, torch.Tensor]:
    """input_ids, loss_mask (a prompt of 4 unsupervised tokens, padding at the end of row 1), hidden,
    anchors and anchor_valid: the drafter's forward arguments."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, cfg.vocab_size - 1, (batch, seq_len), generator=gen)
    loss_mask = torch.ones(batch, seq_len, dtype=torch.bool)
    loss_mask[:, :4] = False
    if batch > 1:
        loss_mask[1, seq_len - 6 :] = False
    hidden = torch.randn(batch, seq_len, cfg.num_context_features * cfg.hidden_size, generator=gen)
    anchors, valid = sample_anchors(loss_mask, num_anchors, cfg.block_size, gen)
    return {
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        "hidden": hidden,
        "anchors": anchors,
        "anchor_valid": valid,
    }
