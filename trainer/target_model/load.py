"""Loading the target, one way for every job (training capture, eval, generation, synthetic data): the
embedded preset with seeded weights, or a local Hugging Face folder (local files only, never the hub), in the
dtype the device policy gives (`trainer.model.device.target_dtype`)."""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dflash_base.errors import ConfigError
from trainer.runspec.target_shapes import is_embedded, target_hf_config
from trainer.target_model.tiny import build_embedded_target, seeded_frozen_weights


def load_target_model(
    path: str, seed: int, device: torch.device, dtype: torch.dtype, keep_layers: int | None = None
) -> Any:  # a Hugging Face causal LM
    """The target causal LM on `device`. `keep_layers`: read only the first N decoder layers' weights (a
    folder's later layers never reach memory; the embedded preset is built whole and cut by its user)."""
    if is_embedded(path):
        return build_embedded_target(path, seed, device, dtype)
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    if keep_layers is not None:
        config.num_hidden_layers = keep_layers  # the weights of later layers are never read into memory
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:keep_layers]
    with no_loading_bar():
        model: Any = AutoModelForCausalLM.from_pretrained(
            path, config=config, local_files_only=True, dtype=dtype
        )
    return model.to(device)


@contextlib.contextmanager
def no_loading_bar() -> Iterator[None]:
    """transformers' "Loading weights" bar, kept out of our output (a bar of 47 tensors drawn in 0.01 s, in the
    middle of `data regenerate`'s and `eval`'s own lines; in a pipe, a \r-joined mess)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def cache_argument(model: nn.Module) -> str:
    """transformers renamed `past_key_values` to `cache`; ask the signature which one this version takes."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def returned_cache(out: Any, name: str) -> Any:
    """The KV cache a forward returned, under whichever name this transformers version uses."""
    return getattr(out, name, None) or out.past_key_values


# ---------------------------------------------------------------- what drafter ranks need from the target


_EMBED_KEYS = ("model.embed_tokens.weight", "embed_tokens.weight")


_LM_HEAD_KEYS = ("lm_head.weight",)


def load_frozen_embeddings(
    path: str, seed: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """(embed_weight, lm_head_weight, hf_config) for drafter ranks: only those two tensors are read.
    An embedded target's are drawn on `device`; a folder's are read to the CPU."""
    hf_config = target_hf_config(path)
    if is_embedded(path):
        embed, lm_head = seeded_frozen_weights(hf_config, seed, device)
        return embed, lm_head, hf_config
    embed = _read_tensor(Path(path), _EMBED_KEYS)
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    lm_head = embed if tied else _read_tensor(Path(path), _LM_HEAD_KEYS)
    return embed, lm_head, hf_config


def _read_tensor(folder: Path, names: tuple[str, ...]) -> torch.Tensor:
    """One tensor from a safetensors folder (sharded or not), without reading the others."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        files = {name: folder / weight_map[name] for name in names if name in weight_map}
    else:
        single = folder / "model.safetensors"
        if not single.is_file():
            raise ConfigError(f"target.path: {folder} has no model.safetensors(.index.json)")
        with safe_open(str(single), framework="pt") as handle:
            keys = set(handle.keys())
        files = {name: single for name in names if name in keys}
    if not files:
        raise ConfigError(f"target.path: {folder} has none of {', '.join(names)} in its safetensors")
    name, file = next(iter(files.items()))
    with safe_open(str(file), framework="pt") as handle:
        return handle.get_tensor(name)
