"""The frozen target on target ranks: run the causal LM up to the last captured layer, return CapturedBatch.

The layers past the last captured one and the LM head are dropped before the weights load (they cost memory
and time and feed nothing), unless the run scores held-out data: then the whole model stays, training
batches still run only up to the last captured layer, and held-out batches run through to the LM head for
the target's own greedy next tokens (`capture_with_greedy`). The captured tensor of layer i is that layer's output, i.e. Hugging Face's
`hidden_states[i + 1]`; HF's *last* `hidden_states` entry has the final norm applied, which is why we hook the
decoder layers instead of asking for `output_hidden_states`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dflash_base.errors import ConfigError
from trainer.model.batch import CapturedBatch
from trainer.spec.target_shapes import is_embedded, target_hf_config
from trainer.target.tiny import build_embedded_target, seeded_frozen_weights

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def target_dtype(name: str, device: torch.device) -> torch.dtype:
    """`target.dtype`: auto means bf16 on CUDA and fp32 on CPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


class CaptureTarget:
    """A frozen causal LM cut after its last captured layer; `capture` returns the concatenated layer outputs.

    `compile_layers` compiles each kept decoder layer's forward (the hooks stay outside, in eager):
    Inductor fuses the fp32 RMSNorms, RoPE and SwiGLU around the matmuls (1.35x at S=3072, 1.17x at
    S=40000 on an H200; see BENCHMARKS.md). One graph serves every layer.

    `inference_tensors` False (colocated ranks) captures under `no_grad` instead of `inference_mode`:
    the drafter on the same rank trains on the captured states, and autograd may not save inference
    tensors for backward (a split's drafter receives fresh tensors, so targets keep inference mode).
    """

    def __init__(
        self,
        model: nn.Module,
        layer_ids: list[int],
        compile_layers: bool = False,
        keep_head: bool = False,
        inference_tensors: bool = True,
    ) -> None:
        body = model.model  # the decoder stack without the LM head
        keep = max(layer_ids) + 1
        if len(body.layers) < keep:
            raise ValueError(f"target has {len(body.layers)} layers, capture needs {keep}")
        self.num_layers = len(body.layers) if keep_head else keep
        body.layers = body.layers[: self.num_layers]
        self.capture_layers = keep
        body.config.num_hidden_layers = keep  # the forward runs config.num_hidden_layers layers
        self.body = body.eval().requires_grad_(False)
        self.lm_head = model.lm_head.requires_grad_(False) if keep_head else None
        self.layer_ids = list(layer_ids)
        self._outputs: dict[int, torch.Tensor] = {}
        self._hooks = [body.layers[i].register_forward_hook(self._hook(i)) for i in self.layer_ids]
        self.compiled = compile_layers
        self.inference_tensors = inference_tensors
        if compile_layers:
            for layer in body.layers:
                layer.forward = torch.compile(layer.forward, dynamic=False)

    def close(self) -> None:
        """Remove the capture hooks (the model stays cut; compiled layers stay compiled)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()

    def _hook(self, layer_id: int):
        def keep_output(_module: nn.Module, _args: Any, output: Any) -> None:
            self._outputs[layer_id] = output[0] if isinstance(output, tuple) else output

        return keep_output

    @property
    def device(self) -> torch.device:
        return next(self.body.parameters()).device

    def capture(self, input_ids: torch.Tensor, loss_mask: torch.Tensor, index: int) -> CapturedBatch:
        """(B, S) ids -> CapturedBatch with hidden (B, S, n_captured * H). Right padding needs no attention
        mask: the model is causal, so pad tokens after a sequence never change the states before them."""
        self._outputs.clear()
        with torch.inference_mode() if self.inference_tensors else torch.no_grad():
            self.body(input_ids=input_ids, use_cache=False)
            hidden = torch.cat([self._outputs[i] for i in self.layer_ids], dim=-1)
        self._outputs.clear()
        return CapturedBatch(input_ids, loss_mask, hidden, index)

    def capture_with_greedy(
        self, input_ids: torch.Tensor, loss_mask: torch.Tensor, index: int, chunk: int = 2048
    ) -> CapturedBatch:
        """A held-out batch: the captured layers as `capture`, plus `target_ids` (B, S): the target's greedy
        next token after each position (all layers, final norm, LM head; `chunk` positions of logits at a
        time, since (S, vocab) logits would be GBs).

        In the same grad mode as `capture`: compiled layers guard on it, so a colocated rank (no_grad)
        scoring under inference mode would recompile its layer graph in the middle of the run."""
        if self.lm_head is None:
            raise RuntimeError("capture_with_greedy needs the target built with keep_head=True")
        self._outputs.clear()
        self.body.config.num_hidden_layers = self.num_layers
        with torch.inference_mode() if self.inference_tensors else torch.no_grad():
            try:
                normed = self.body(input_ids=input_ids, use_cache=False).last_hidden_state
            finally:
                self.body.config.num_hidden_layers = self.capture_layers
            hidden = torch.cat([self._outputs[i] for i in self.layer_ids], dim=-1)
            self._outputs.clear()
            flat = normed.reshape(-1, normed.shape[-1])
            greedy = torch.cat(
                [self.lm_head(flat[r : r + chunk]).argmax(-1) for r in range(0, len(flat), chunk)]
            )
        return CapturedBatch(input_ids, loss_mask, hidden, index, greedy.view(input_ids.shape))


def load_capture_target(
    path: str,
    layer_ids: list[int],
    seed: int,
    device: torch.device,
    dtype: torch.dtype,
    compile_layers: bool = False,
    keep_head: bool = False,
    inference_tensors: bool = True,
) -> CaptureTarget:
    """Build the embedded target, or load a local folder with only the layers capture needs (all of them
    and the LM head with `keep_head`, for held-out scoring)."""
    if is_embedded(path):
        model = build_embedded_target(path, seed, device, dtype)
        return CaptureTarget(model, layer_ids, compile_layers, keep_head, inference_tensors)
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    if not keep_head:
        keep = max(layer_ids) + 1
        config.num_hidden_layers = keep  # the weights of later layers are never read into memory
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:keep]
    model = AutoModelForCausalLM.from_pretrained(path, config=config, local_files_only=True, dtype=dtype)
    return CaptureTarget(model.to(device), layer_ids, compile_layers, keep_head, inference_tensors)


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
