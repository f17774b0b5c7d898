"""Targets that need no download: an embedded tiny Qwen3 and Qwen3-shaped presets, with seeded random weights.

`target.path = "tiny"` is the default for CPU runs and tests; `target.path = "random:qwen3-8b"` gives a
Qwen3-8B-shaped model with random weights, for measuring throughput on a GPU without fetching 16 GB.
Every weight is a pure function of the seed, so each rank (and each restart) builds the same model.
Their configs (shapes only, no torch model code) live in trainer/runspec/target_shapes.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from trainer.runspec.target_shapes import embedded_config, tiny_qwen3_config

if TYPE_CHECKING:
    from transformers import Qwen3Config, Qwen3ForCausalLM

# The tiny target's embedding and LM head are drawn larger than its layers (0.02): the residual stream is
# then led by the current token, the next-token distribution is peaked, and sequences sampled at a low
# temperature carry structure a drafter can learn (with every weight at 0.02 the logits are near uniform).
_TINY_FROZEN_STD = 0.25


def seeded_frozen_weights(
    config: Qwen3Config, seed: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(embed, lm_head) of an embedded target, drawn from their own generator on `device`.

    Drafter ranks need only these two tensors; drawing them apart from the body means a drafter rank can make
    them without building the whole (possibly 8B-parameter) target. On CUDA they are drawn on the GPU
    (torchrun workers run with one CPU thread: 1.2B values drawn there take many seconds); every CUDA
    device gives the same values for the same seed, so target and drafter ranks agree.
    """
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + 17)
    std = (
        _TINY_FROZEN_STD if config.vocab_size == tiny_qwen3_config().vocab_size else config.initializer_range
    )
    shape = (config.vocab_size, config.hidden_size)
    embed = torch.randn(shape, generator=gen, device=device) * std
    lm_head = torch.randn(shape, generator=gen, device=device) * std
    return embed, lm_head


def build_embedded_target(
    path: str, seed: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> Qwen3ForCausalLM:
    """The embedded target with seeded random weights, frozen, in eval mode."""
    # Imported here: the modeling code costs ~1.8 s of imports (CPU box) that drafter ranks, the warm-up
    # child and the launcher, which need only the config, should not pay.
    from transformers import Qwen3ForCausalLM

    config = embedded_config(path)
    previous_dtype = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)  # build in the final dtype: an 8B model in fp32 would be 32 GB
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            with torch.device(device):
                model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous_dtype)
    embed, lm_head = seeded_frozen_weights(config, seed, device)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(lm_head)
    model.to(dtype=dtype).eval().requires_grad_(False)  # type: ignore[call-arg]  # transformers' typed `to` wrapper
    return model
