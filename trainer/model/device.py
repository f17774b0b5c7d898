"""The device and precision policy, in one place: which device a rank runs on, which attention and
autocast it uses there, and the dtypes of the target and of the drafter's frozen tensors."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import torch

from dflash_base.errors import ConfigError

if TYPE_CHECKING:
    from trainer.runspec.config import PrecisionSection, TrainConfig


_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def target_dtype(name: str, device: torch.device) -> torch.dtype:
    """`target.dtype`: auto means bf16 on CUDA and fp32 on CPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """`run.device`: auto picks CUDA when there is one; `cuda:N` names one device (warm-up)."""
    if name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ConfigError(f'run.device: "{name}" but torch sees no CUDA device')
        return torch.device(name)
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ConfigError('run.device: "cuda" but torch sees no CUDA device')
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def attention_for(cfg: TrainConfig, device: torch.device) -> str:
    """`drafter.attention`: auto is compiled flex on CUDA, exact SDPA on CPU (CPU flex has no backward)."""
    kind = cfg.drafter.attention
    if kind == "auto":
        return "flex" if device.type == "cuda" else "sdpa"
    if kind == "flex" and device.type != "cuda":
        raise ConfigError(
            'drafter.attention: "flex" cannot train on CPU (no backward there); use "sdpa" or "auto"'
        )
    return kind


def autocast_for(precision: PrecisionSection, device: torch.device) -> AbstractContextManager[Any]:
    """A fresh context for one step: bf16 autocast on CUDA (auto/bf16); nothing on CPU or when off."""
    if precision.autocast == "off" or device.type != "cuda":
        return nullcontext()
    return torch.autocast("cuda", torch.bfloat16)


def hidden_dtype_for(cfg: TrainConfig, device: torch.device) -> torch.dtype:
    """The captured hidden states' dtype: the target's."""
    return target_dtype(cfg.target.dtype, device)


def frozen_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype:
    """The drafter's frozen embedding and LM head: the autocast dtype on CUDA (bf16), else fp32. In fp32,
    autocast would re-cast the whole head for every loss chunk and hold an extra ~5 GB at Qwen3 sizes."""
    return torch.bfloat16 if device.type == "cuda" and cfg.precision.autocast != "off" else torch.float32
