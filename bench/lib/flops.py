"""Model FLOPs of each role, one convention for every benchmark (what the model must do, not what ran).

Target capture (inference, no backward):
  linear layers  2 x (linear params of the layers that run) x tokens
  attention      causal: QK^T and PV (2 matmuls) x 2 FLOPs per multiply-add x S^2/2 pairs x (heads x head_dim)
                 = 2 x S^2 x heads x head_dim per layer (the REFERENCE.md "~2 x S^2 x 4096 per layer")
  LM head        2 x vocab x hidden x tokens, only when it runs (the untruncated baseline)
  The embedding is a lookup (0 FLOPs); norms, RoPE and activations are not counted.

Drafter step (training): `model_flops` (trainable matmuls x3 for forward and the two
backward products, the frozen LM head x2, attention over the mask's unmasked pairs only), with the pairs
counted exactly from the anchors by `attended_pairs` (no dense mask needed at 40000-token contexts).

MFU = FLOPs / seconds / peak; the peak is the bf16 matmul rate measured on an H200 (790 TFLOP/s).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

if TYPE_CHECKING:
    from trainer.model.drafter import DrafterConfig

H200_BF16_PEAK_TFLOPS = 790.0  # measured bf16 matmul ceiling on an H200 (REFERENCE.md section 5)


def linear_params_per_layer(hf_config: Any) -> int:
    """q, k, v, o projections and the SwiGLU MLP of one Qwen3-style decoder layer (weights only)."""
    hidden = int(hf_config.hidden_size)
    heads = int(hf_config.num_attention_heads)
    head_dim = int(getattr(hf_config, "head_dim", None) or hidden // heads)
    kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or heads)
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    attention = hidden * q_width + 2 * hidden * kv_width + q_width * hidden
    mlp = 3 * hidden * int(hf_config.intermediate_size)
    return attention + mlp


def target_flops(hf_config: Any, seq_len: int, layers: int, lm_head: bool, batch: int = 1) -> float:
    """Forward FLOPs of `layers` decoder layers over `batch` sequences of `seq_len` tokens (causal)."""
    hidden = int(hf_config.hidden_size)
    heads = int(hf_config.num_attention_heads)
    head_dim = int(getattr(hf_config, "head_dim", None) or hidden // heads)
    linear = 2 * linear_params_per_layer(hf_config) * seq_len
    attention = 2 * seq_len**2 * heads * head_dim
    head = 2 * int(hf_config.vocab_size) * hidden * seq_len if lm_head else 0
    return float(batch * (layers * (linear + attention) + head))


def attended_pairs(anchors: Tensor, anchor_valid: Tensor, block_size: int) -> float:
    """(query, key) pairs the DFlash mask lets through, summed over the batch (exact, O(N)).

    Each block's B rows see the context keys before its anchor (none for a padding anchor) and the B
    keys of their own block: B x (context_end + B) pairs per block.
    """
    context_end = anchors.where(anchor_valid, anchors.new_zeros(()))
    return float(block_size * (context_end.sum().item() + anchors.numel() * block_size))


def model_flops(cfg: DrafterConfig, batch: int, seq_len: int, q_len: int, attended_pairs: float) -> float:
    """Training FLOPs of one drafter step (the convention above; why `fc` counts x3: bench/kernels/drafter_step.py)."""
    h, i, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    q_width, kv_width = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    per_layer = (
        2 * q_len * h * (q_width + 2 * kv_width)  # q, k, v of the block tokens
        + 2 * seq_len * h * 2 * kv_width  # k, v of the context
        + 2 * q_len * q_width * h  # o_proj
        + 2 * q_len * 3 * h * i  # SwiGLU MLP
        + 4 * cfg.num_attention_heads * cfg.head_dim * attended_pairs / batch  # QK^T and PV
    )
    fc = 2 * seq_len * cfg.num_context_features * h * h
    trainable = cfg.num_hidden_layers * per_layer + fc
    head = 2 * q_len * (cfg.block_size - 1) / cfg.block_size * h * v  # slot 0 never reaches the head
    return batch * (3 * trainable + 2 * head)
