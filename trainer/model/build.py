"""Build the drafter a run config describes: the one factory training, the warm-up and the benches call,
so that every one of them compiles the same graphs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from trainer.model.device import attention_for, frozen_dtype
from trainer.model.drafter import DFlashDrafter, DrafterConfig

if TYPE_CHECKING:
    from trainer.runspec.config import TrainConfig


def build_drafter(
    cfg: TrainConfig, hf_config: Any, embed: torch.Tensor, lm_head: torch.Tensor, device: torch.device
) -> DFlashDrafter:
    """The drafter in fp32 on `device`, its init fixed by the run seed (every drafter rank starts equal).

    The frozen embedding and LM head take `frozen_dtype` (bf16 under autocast on CUDA). On CUDA the
    decoder layers are compiled (`drafter.compile_layers`); the first step, the warm-up, compiles them.
    """
    d = cfg.drafter
    assert d.mask_token_id is not None and d.target_layer_ids is not None, "load_config fills these"
    dcfg = DrafterConfig.from_target(
        hf_config, d.layers, d.block_size, d.mask_token_id, d.target_layer_ids, d.intermediate_size
    )
    frozen = frozen_dtype(cfg, device)
    # Drawn on the device (torchrun workers have one CPU thread: ~1B values on the CPU take many
    # seconds); the seed fixes them on every device of a kind, and DDP broadcasts rank 0's anyway.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.device(device):
        torch.manual_seed(cfg.run.seed)
        model = DFlashDrafter(
            dcfg,
            embed.to(frozen),
            lm_head.to(frozen),
            attention=attention_for(cfg, device),  # type: ignore[arg-type]
            loss_chunk=d.loss_chunk,
            compile_loss=d.compile_loss,
            gamma=cfg.optim.gamma,
            flex_options=dict(d.flex_kernel_options) or None,
        )
    model = model.to(device)
    if d.compile_layers and device.type == "cuda":
        model.compile_layers(None if d.compile_mode == "default" else d.compile_mode)  # in the warm-up
    return model
