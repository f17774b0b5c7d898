"""AdamW, linear warmup then cosine decay to `min_lr_ratio`, and grad-norm clipping."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from trainer.runspec.config import OptimSection


def lr_factor(step: int, total_steps: int, warmup_ratio: float, min_lr_ratio: float) -> float:
    """The multiplier of the peak lr at `step` (0-based): linear warmup, then cosine down to min_lr_ratio."""
    warmup = math.ceil(warmup_ratio * total_steps)
    if step < warmup:
        return (step + 1) / warmup
    decay_steps = max(1, total_steps - warmup)
    progress = min(1.0, (step - warmup) / decay_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(model: nn.Module, optim: OptimSection, device: torch.device) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; weight decay on matrices only (not norms); fused on CUDA."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for _, p in trainable if p.ndim >= 2], "weight_decay": optim.weight_decay},
        {"params": [p for _, p in trainable if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        [g for g in groups if g["params"]],
        lr=optim.lr,
        betas=optim.betas,
        fused=device.type == "cuda",
    )


def build_scheduler(optimizer: torch.optim.Optimizer, optim: OptimSection, total_steps: int) -> LambdaLR:
    return LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, optim.warmup_ratio, optim.min_lr_ratio)
    )


def clip_gradients(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip the global grad norm; returns the norm before clipping, as a 0-dim tensor on the gradients'
    device (reading it is a host sync: the loop reads it once the next batch's work is queued)."""
    params = [p for p in model.parameters() if p.grad is not None]
    return torch.nn.utils.clip_grad_norm_(params, max_norm)
