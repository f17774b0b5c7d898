"""The frozen target on target ranks: run the causal LM up to the last captured layer, return CapturedBatch.

The layers past the last captured one and the LM head are dropped before the weights load (they cost memory
and time and feed nothing), unless the run scores held-out data: then the whole model stays, training
batches still run only up to the last captured layer, and held-out batches run through to the LM head for
the target's own greedy next tokens (`capture_with_greedy`). The captured tensor of layer i is that layer's output, i.e. Hugging Face's
`hidden_states[i + 1]`; HF's *last* `hidden_states` entry has the final norm applied, which is why we hook the
decoder layers instead of asking for `output_hidden_states`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainer.model.batch import CapturedBatch
from trainer.model.device import target_dtype
from trainer.target_model.load import load_target_model

if TYPE_CHECKING:
    from trainer.runspec.config import TrainConfig


class LayerOutputs:
    """Forward hooks that keep the outputs of the chosen decoder layers during one forward; `take()` returns
    them concatenated on features, in `layer_ids` order (layer i's output is HF's `hidden_states[i + 1]`).
    Training's capture and eval's decoding both read the target's layers through this one hook."""

    def __init__(self, layers: Any, layer_ids: list[int]) -> None:
        self.layer_ids = list(layer_ids)
        self._outputs: dict[int, torch.Tensor] = {}
        self._hooks = [layers[i].register_forward_hook(self._keeper(i)) for i in self.layer_ids]

    def _keeper(self, layer_id: int) -> Callable[..., None]:
        def keep_output(_module: nn.Module, _args: Any, output: Any) -> None:
            self._outputs[layer_id] = output[0] if isinstance(output, tuple) else output

        return keep_output

    def clear(self) -> None:
        self._outputs.clear()

    def take(self) -> torch.Tensor:
        """(..., n_layers * H) of the last forward; forgets them."""
        hidden = torch.cat([self._outputs[i] for i in self.layer_ids], dim=-1)
        self._outputs.clear()
        return hidden

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()


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
        model: Any,  # a Hugging Face causal LM (its .model stack and .lm_head)
        layer_ids: list[int],
        compile_layers: bool = False,
        keep_head: bool = False,
        inference_tensors: bool = True,
    ) -> None:
        body: Any = model.model  # the decoder stack without the LM head
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
        self.outputs = LayerOutputs(body.layers, self.layer_ids)
        self.compiled = compile_layers
        self.inference_tensors = inference_tensors
        if compile_layers:
            for layer in body.layers:
                layer.forward = torch.compile(layer.forward, dynamic=False)

    def close(self) -> None:
        """Remove the capture hooks (the model stays cut; compiled layers stay compiled)."""
        self.outputs.close()

    @property
    def device(self) -> torch.device:
        return next(self.body.parameters()).device

    def capture(self, input_ids: torch.Tensor, loss_mask: torch.Tensor, index: int) -> CapturedBatch:
        """(B, S) ids -> CapturedBatch with hidden (B, S, n_captured * H). Right padding needs no attention
        mask: the model is causal, so pad tokens after a sequence never change the states before them."""
        self.outputs.clear()
        with torch.inference_mode() if self.inference_tensors else torch.no_grad():
            self.body(input_ids=input_ids, use_cache=False)
            hidden = self.outputs.take()
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
        self.outputs.clear()
        self.body.config.num_hidden_layers = self.num_layers
        with torch.inference_mode() if self.inference_tensors else torch.no_grad():
            try:
                normed = self.body(input_ids=input_ids, use_cache=False).last_hidden_state
            finally:
                self.body.config.num_hidden_layers = self.capture_layers
            hidden = self.outputs.take()
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
    """The target with only the layers capture needs (all of them and the LM head with `keep_head`, for
    held-out scoring), wrapped for capture."""
    keep = None if keep_head else max(layer_ids) + 1
    model = load_target_model(path, seed, device, dtype, keep_layers=keep)
    return CaptureTarget(model, layer_ids, compile_layers, keep_head, inference_tensors)


def capture_target_for(cfg: TrainConfig, device: torch.device, colocated: bool) -> CaptureTarget:
    """The run's target on this rank, as training builds it. The warm-up builds its target through here
    too: any argument that differed would compile another graph, and the first real step would compile
    cold, which is what the warm-up exists to prevent."""
    assert cfg.drafter.target_layer_ids is not None, "load_config fills these"
    return load_capture_target(
        cfg.target.path,
        cfg.drafter.target_layer_ids,
        cfg.run.seed,
        device,
        target_dtype(cfg.target.dtype, device),
        compile_layers=cfg.target.compile_layers and device.type == "cuda",
        keep_head=cfg.data.holds_out,  # held-out batches need the target's own greedy tokens
        inference_tensors=not colocated,  # a colocated drafter trains on the captured tensors
    )
