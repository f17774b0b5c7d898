"""The DFlash drafter: a small non-causal Qwen3-style stack that drafts a block of tokens at once.

Read top to bottom: config, norm and RoPE, attention, MLP, layer, model.

Inputs per step (one CapturedBatch plus sampled anchors):
  input_ids (B, S), loss_mask (B, S), hidden (B, S, n*H): n captured target layers, concatenated;
  anchors (B, N) and anchor_valid (B, N): the block starts (see trainer/model/anchors.py).
The context `hidden_norm(fc(hidden))` (B, S, H) is projected by every layer's k_proj/v_proj into extra
keys and values. The block tokens (slot 0 = the anchor token, slots 1.. = the mask token, embedded with
the target's frozen embedding) are the queries; positions are anchor + slot. Keys/values are laid out
[context S | blocks N*B] and masked as trainer/model/attention.py describes. The final norm's output goes
through the target's frozen LM head into the decayed loss (trainer/model/loss.py).

Parameter names match the checkpoints SGLang and vLLM load (`layers.{i}.self_attn.q_proj.weight`, ...,
`fc.weight`, `hidden_norm.weight`, `norm.weight`); the frozen embedding and LM head are non-persistent
buffers: they move with `.to()` but are neither trained, checkpointed, exported nor synced by DDP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.flex_attention import BlockMask

from trainer.model.attention import (
    attend,
    context_ends,
    dense_mask,
    dflash_block_mask,
    flex_context_len,
    keys_layout,
)
from trainer.model.loss import LossOutput, block_targets, default_gamma, dflash_loss
from trainer.runspec.target_shapes import default_target_layer_ids

AttentionKind = Literal["sdpa", "flex"]
Mask = Tensor | BlockMask  # dense boolean (SDPA) or sparse block mask (flex)


@dataclass
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    max_position_embeddings: int
    block_size: int
    target_layer_ids: list[int] = field(default_factory=list)
    mask_token_id: int = 0
    num_target_layers: int = 0

    def __post_init__(self) -> None:
        positive = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
        for name in (*positive, "num_key_value_heads", "head_dim", "vocab_size", "num_target_layers"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"DrafterConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"DrafterConfig.num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"DrafterConfig.head_dim must be even (RoPE), got {self.head_dim}")
        if self.block_size < 2:
            raise ValueError(f"DrafterConfig.block_size must be >= 2, got {self.block_size}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(
                f"DrafterConfig.mask_token_id {self.mask_token_id} is outside the vocabulary (0..{self.vocab_size - 1})"
            )
        if not self.target_layer_ids:
            raise ValueError("DrafterConfig.target_layer_ids must name at least one target layer")
        bad = [i for i in self.target_layer_ids if not 0 <= i < self.num_target_layers]
        if bad:
            raise ValueError(
                f"DrafterConfig.target_layer_ids {bad} out of range for a {self.num_target_layers}-layer target"
            )

    @property
    def num_context_features(self) -> int:
        return len(self.target_layer_ids)

    @classmethod
    def from_target(
        cls,
        target_config: Any,
        num_hidden_layers: int,
        block_size: int,
        mask_token_id: int,
        target_layer_ids: list[int] | None = None,
        intermediate_size: int | None = None,
    ) -> DrafterConfig:
        """Size the drafter like its target (a transformers Qwen3Config or anything with those fields)."""
        heads = int(target_config.num_attention_heads)
        head_dim = getattr(target_config, "head_dim", None) or int(target_config.hidden_size) // heads
        rope_theta = getattr(target_config, "rope_theta", None)
        if rope_theta is None:  # transformers >= 5 keeps it in rope_parameters
            rope_theta = (getattr(target_config, "rope_parameters", None) or {}).get(
                "rope_theta", 1_000_000.0
            )
        num_target_layers = int(target_config.num_hidden_layers)
        return cls(
            hidden_size=int(target_config.hidden_size),
            intermediate_size=int(intermediate_size or target_config.intermediate_size),
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=heads,
            num_key_value_heads=int(getattr(target_config, "num_key_value_heads", None) or heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(target_config.rms_norm_eps),
            rope_theta=float(rope_theta),
            vocab_size=int(target_config.vocab_size),
            max_position_embeddings=int(target_config.max_position_embeddings),
            block_size=block_size,
            target_layer_ids=list(
                target_layer_ids or default_target_layer_ids(num_target_layers, num_hidden_layers)
            ),
            mask_token_id=mask_token_id,
            num_target_layers=num_target_layers,
        )


# --- norm and rotary embedding ------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Qwen3 RMSNorm, always computed in fp32 (also under bf16 autocast); returns the input dtype."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * x32).to(x.dtype)


def rope_cos_sin(positions: Tensor, inv_freq: Tensor) -> tuple[Tensor, Tensor]:
    """cos, sin (*positions.shape, head_dim) in fp32 for integer positions (Qwen3 / NeoX layout)."""
    freqs = positions.float().unsqueeze(-1) * inv_freq  # (..., D/2)
    angles = torch.cat([freqs, freqs], dim=-1)  # (..., D)
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, L, heads, D); cos/sin broadcastable to (B, L, 1, D). Rotation in fp32, result in fp32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return x.float() * cos + rotated * sin


# --- attention, MLP, layer ------------------------------------------------------------------------------


class DFlashAttention(nn.Module):
    """Qwen3 attention (q/k norm, RoPE, GQA), non-causal, with the context injected as extra K/V."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.flex_options: dict[str, Any] | None = None  # flex_attention kernel_options (the drafter sets)

    def _heads(self, x: Tensor, heads: int) -> Tensor:
        return x.view(*x.shape[:2], heads, self.head_dim)  # (B, L, heads, D)

    def block_qkv(self, x: Tensor, rope_q: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """The block tokens' queries (B, Hq, Q, D), keys and values (B, Hkv, Q, D), RoPE applied."""
        q = self.q_norm(self._heads(self.q_proj(x), self.num_heads))
        k = self.k_norm(self._heads(self.k_proj(x), self.num_kv_heads))
        v = self._heads(self.v_proj(x), self.num_kv_heads)
        cos, sin = (t.unsqueeze(2) for t in rope_q)  # (B, Q, 1, D)
        dtype = v.dtype  # bf16 under autocast, else the parameter dtype
        q = apply_rope(q, cos, sin).to(dtype).transpose(1, 2).contiguous()
        return q, apply_rope(k, cos, sin).to(dtype).transpose(1, 2), v.transpose(1, 2)

    def context_kv(self, context: Tensor, rope_ctx: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """The context's keys and values (B, Hkv, S, D): they depend on the context alone, so training
        projects them once per layer per step and decoding once per position (`ContextCache`, and the
        engine's static context cache, whose rows sit at their own positions: rope (B, S, D) there)."""
        k = self.k_norm(self._heads(self.k_proj(context), self.num_kv_heads))
        v = self._heads(self.v_proj(context), self.num_kv_heads)
        cos, sin = (t.unsqueeze(-2) for t in rope_ctx)  # (S, 1, D), or (B, S, 1, D) per row
        return apply_rope(k, cos, sin).to(v.dtype).transpose(1, 2), v.transpose(1, 2)

    def forward(
        self,
        x: Tensor,  # (B, Q, H) block tokens, normed
        context: Tensor,  # (B, S, H) hidden_norm(fc(captured)); the same for every layer
        rope_q: tuple[Tensor, Tensor],  # cos, sin (B, Q, D): positions anchor + slot
        rope_ctx: tuple[Tensor, Tensor],  # cos, sin (S, D): positions 0..S-1
        mask: Mask,
    ) -> Tensor:
        q, k_blk, v_blk = self.block_qkv(x, rope_q)
        k_ctx, v_ctx = self.context_kv(context, rope_ctx)
        k = keys_layout(k_ctx, k_blk, mask)  # (B, Hkv, KV, D)
        v = keys_layout(v_ctx, v_blk, mask)
        return self._out(attend(q, k, v, mask, self.flex_options), x)

    def forward_cached(
        self, x: Tensor, k_ctx: Tensor, v_ctx: Tensor, rope_q: tuple[Tensor, Tensor]
    ) -> Tensor:
        """Decoding's one block: it sees every cached context position (all are before its anchor) and
        itself, so no mask. k_ctx, v_ctx (1, Hkv, S, D) from `context_kv`."""
        q, k_blk, v_blk = self.block_qkv(x, rope_q)
        k, v = torch.cat([k_ctx, k_blk], dim=2), torch.cat([v_ctx, v_blk], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1])
        return self._out(out, x)

    def _out(self, attended: Tensor, x: Tensor) -> Tensor:
        """(B, Hq, Q, D) -> o_proj over the heads, (B, Q, H)."""
        out = attended.transpose(1, 2).reshape(x.shape[0], x.shape[1], self.num_heads * self.head_dim)
        return self.o_proj(out)


class MLP(nn.Module):
    """Qwen3 SwiGLU MLP."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm residual layer. The context is not re-normed per layer (serving engines do the same)."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        x: Tensor,
        context: Tensor,
        rope_q: tuple[Tensor, Tensor],
        rope_ctx: tuple[Tensor, Tensor],
        mask: Mask,
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), context, rope_q, rope_ctx, mask)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_cached(
        self, x: Tensor, k_ctx: Tensor, v_ctx: Tensor, rope_q: tuple[Tensor, Tensor]
    ) -> Tensor:
        """The layer for decoding's one block over a cached context (`DFlashAttention.forward_cached`)."""
        x = x + self.self_attn.forward_cached(self.input_layernorm(x), k_ctx, v_ctx, rope_q)
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass
class ContextCache:
    """Every layer's context keys and values for one sequence being decoded, positions 0..length-1.

    A block's context is every position before its anchor, and those positions' captured features never
    change once the target has accepted them: decoding projects each position once (`extend_context`)
    instead of the whole context at every block (at 40,000-token contexts and Qwen3-8B shapes, `fc` alone
    over the whole context would be ~6.7 TFLOP a block)."""

    keys: list[Tensor] = field(default_factory=list)  # per layer (1, Hkv, length, D), RoPE applied
    values: list[Tensor] = field(default_factory=list)
    length: int = 0


# --- the model ------------------------------------------------------------------------------------------


class DFlashDrafter(nn.Module):
    # The target's frozen tensors and the RoPE frequencies: buffers, typed here for the checker.
    embed_weight: Tensor
    lm_head_weight: Tensor
    inv_freq: Tensor

    def __init__(
        self,
        cfg: DrafterConfig,
        embed_weight: Tensor,
        lm_head_weight: Tensor,
        attention: AttentionKind = "sdpa",
        loss_chunk: int = 2048,
        gamma: float | None = None,
        compile_loss: bool = False,
        flex_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if attention not in ("sdpa", "flex"):
            raise ValueError(f"attention must be 'sdpa' or 'flex', got {attention!r}")
        for name, weight in (("embed_weight", embed_weight), ("lm_head_weight", lm_head_weight)):
            if tuple(weight.shape) != (cfg.vocab_size, cfg.hidden_size):
                raise ValueError(
                    f"{name} has shape {tuple(weight.shape)}, expected (vocab_size, hidden_size) = "
                    f"({cfg.vocab_size}, {cfg.hidden_size})"
                )
        if loss_chunk < 1:
            raise ValueError(f"loss_chunk must be >= 1, got {loss_chunk}")
        self.cfg = cfg
        self.attention = attention
        self.loss_chunk = loss_chunk
        self.compile_loss = compile_loss  # LM head + CE chunk through torch.compile (trainer/model/loss.py)
        self.gamma = float(gamma) if gamma is not None else default_gamma(cfg.block_size)

        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        for layer in self.layers:
            layer.self_attn.flex_options = flex_options  # type: ignore[union-attr]
        self.fc = nn.Linear(cfg.num_context_features * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

        # The target's, frozen: non-persistent buffers (not trained, not in state_dict, not exported).
        self.register_buffer("embed_weight", embed_weight.detach(), persistent=False)
        self.register_buffer("lm_head_weight", lm_head_weight.detach(), persistent=False)
        inv_freq = 1.0 / (
            cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim)
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        # DDP must neither broadcast these at start nor every step (the embedding and head are ~GBs).
        self._ddp_params_and_buffers_to_ignore = ["embed_weight", "lm_head_weight", "inv_freq"]
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)  # Qwen3 initializer_range

    @property
    def decoder_layers(self) -> list[DecoderLayer]:
        """`layers`, typed (an nn.ModuleList's items are plain Modules to the checker)."""
        return [cast(DecoderLayer, layer) for layer in self.layers]

    @property
    def layers_compiled(self) -> bool:
        """Whether `compile_layers` ran (nn.Module.compile keeps its compiled call here)."""
        return any(getattr(layer, "_compiled_call_impl", None) for layer in self.layers)

    def compile_layers(self, mode: str | None = None) -> None:
        """Compile every decoder layer, not the stack: one graph (forward and backward) for any depth.

        The layers share their code and shapes, and parameters are graph inputs, so Dynamo's cache for
        `DecoderLayer.forward` serves every layer once the first is compiled (see `run_layers` for why the
        first layer's input is marked as needing a gradient). Inductor fuses the fp32 norms, RoPE, the
        residual adds and SwiGLU's elementwise work into the matmuls' neighbours; flex attention is traced
        inline. Call before the warm-up step. `mode` is torch.compile's (e.g.
        "max-autotune-no-cudagraphs": autotuned kernels, a much longer compile)."""
        for layer in self.layers:
            layer.compile(dynamic=False, mode=mode)

    def run_layers(
        self,
        x: Tensor,
        context: Tensor,
        rope_q: tuple[Tensor, Tensor],
        rope_ctx: tuple[Tensor, Tensor],
        mask: Mask,
    ) -> Tensor:
        """The decoder stack. With compiled layers in training, the first layer's input (the frozen
        embedding, which needs no gradient) is made to need one: graphs specialise on that, so without it
        the first layer compiled a forward and a backward graph of its own (two of the six graphs of a
        b16 warm-up). The price is that input's gradient, three (Q, H) x (H, H + 2 * kv) matmuls in
        backward, ~0.6% of a b16 step's FLOPs, and that gradient itself: a (B, Q, H) tensor in the input's
        fp32, held briefly at the end of backward until it is summed into the zero scalar (128 MiB at b16;
        the memory plan's `first_layer_input_grad`), never kept across steps."""
        if self.layers_compiled and torch.is_grad_enabled() and not x.requires_grad:
            x = x + torch.zeros((), dtype=x.dtype, device=x.device, requires_grad=True)
        for layer in self.layers:
            x = layer(x, context, rope_q, rope_ctx, mask)
        return x

    def _mask(self, anchors: Tensor, anchor_valid: Tensor, context_len: int) -> Mask:
        """The step's mask (dense or block), built once and shared by all layers."""
        block = self.cfg.block_size
        if self.attention == "sdpa":
            return dense_mask(anchors, anchor_valid, context_len, block)
        if (
            anchors.device.type == "cpu"
            and torch.is_grad_enabled()
            and any(p.requires_grad for p in self.parameters())
        ):
            raise RuntimeError(
                "flex_attention has no backward on CPU: train with attention='sdpa' on CPU "
                "(flex on CPU is only for forward checks under torch.no_grad())"
            )
        # The flex layout pads the context to the tile (see flex_context_len): 1.09x faster flex at S=40000.
        return dflash_block_mask(context_ends(anchors, anchor_valid), flex_context_len(context_len), block)

    def block_inputs(self, anchor_tokens: Tensor, anchors: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """The blocks' input tokens and their RoPE, built one way for training, held-out scoring and
        decoding: slot 0 the anchor token, slots 1.. the mask token, embedded with the target's frozen
        embedding in the parameters' dtype, at positions anchor + slot. anchor_tokens, anchors (B, N) ->
        x (B, N * block, H) and cos, sin (B, N * block, D)."""
        batch, num_anchors = anchors.shape
        block = self.cfg.block_size
        block_ids = torch.full(
            (batch, num_anchors, block), self.cfg.mask_token_id, dtype=torch.long, device=anchors.device
        )
        block_ids[:, :, 0] = anchor_tokens
        x = F.embedding(block_ids.view(batch, num_anchors * block), self.embed_weight)
        slots = torch.arange(block, device=anchors.device)
        rope_q = rope_cos_sin((anchors.unsqueeze(-1) + slots).view(batch, -1), self.inv_freq)
        return x.to(self.fc.weight.dtype), rope_q

    def draft_hidden(
        self, input_ids: Tensor, hidden: Tensor, anchors: Tensor, anchor_valid: Tensor
    ) -> Tensor:
        """The final-norm hidden states of every block slot: (B, N, block, H)."""
        batch, seq_len = input_ids.shape
        if not torch.is_autocast_enabled(hidden.device.type):
            hidden = hidden.to(self.fc.weight.dtype)
        context = self.hidden_norm(self.fc(hidden))  # (B, S, H)
        # slot 0 of each block: the real anchor token
        x, rope_q = self.block_inputs(torch.gather(input_ids, 1, anchors), anchors)  # (B, Q, H)
        rope_ctx = rope_cos_sin(torch.arange(seq_len, device=hidden.device), self.inv_freq)  # (S, D)
        mask = self._mask(anchors, anchor_valid, seq_len)
        x = self.run_layers(x, context, rope_q, rope_ctx, mask)
        return self.norm(x).view(batch, anchors.shape[1], self.cfg.block_size, self.cfg.hidden_size)

    @torch.no_grad()
    def draft_tokens(
        self, input_ids: Tensor, hidden: Tensor, anchors: Tensor, anchor_valid: Tensor
    ) -> Tensor:
        """The drafter's greedy tokens for slots 1..B-1 of every anchor: (B, N, block-1), the whole context
        projected for the batch. Held-out scoring drafts with this; decoding (`eval`) drafts with
        `draft_after` over a context cache. Both build the block with `block_inputs` and run the same
        layers, and tests/trainer/eval/test_context_cache.py checks that they draft the same tokens, so the
        held-out estimate measures what decoding proposes."""
        out = self.draft_hidden(input_ids, hidden, anchors, anchor_valid)[:, :, 1:]
        rows = out.reshape(-1, out.shape[-1])
        weight = self.lm_head_weight.to(rows.dtype)
        chunk = self.loss_chunk  # (rows, vocab) logits a chunk at a time: all of them would be GBs
        tokens = torch.cat(
            [F.linear(rows[r : r + chunk], weight).argmax(-1) for r in range(0, len(rows), chunk)]
        )
        return tokens.view(out.shape[:-1])

    @torch.no_grad()
    def extend_context(self, cache: ContextCache, features: Tensor) -> None:
        """Append the next positions' captured features (1, L, n*H) to `cache`: `fc`, `hidden_norm` and every
        layer's context keys and values, computed for those L positions only."""
        start, count = cache.length, features.shape[1]
        if not torch.is_autocast_enabled(features.device.type):
            features = features.to(self.fc.weight.dtype)
        context = self.hidden_norm(self.fc(features))  # (1, L, H)
        rope = rope_cos_sin(torch.arange(start, start + count, device=features.device), self.inv_freq)
        for i, layer in enumerate(self.decoder_layers):
            k, v = layer.self_attn.context_kv(context, rope)
            if i == len(cache.keys):
                cache.keys.append(k)
                cache.values.append(v)
            else:
                cache.keys[i] = torch.cat([cache.keys[i], k], dim=2)
                cache.values[i] = torch.cat([cache.values[i], v], dim=2)
        cache.length += count

    @torch.no_grad()
    def hidden_after(self, cache: ContextCache, anchor_token: int) -> Tensor:
        """The final-norm hidden states (block, H) of the block anchored at position `cache.length` (slot 0:
        `anchor_token`), seeing every cached position: `draft_hidden` for that one anchor and the whole
        context, without projecting the context again."""
        if not cache.length:
            raise ValueError("the context cache is empty: extend_context first (a block needs a context)")
        anchor = torch.tensor([[cache.length]], device=self.embed_weight.device)
        x, rope_q = self.block_inputs(torch.full_like(anchor, anchor_token), anchor)  # (1, B, H)
        for layer, k_ctx, v_ctx in zip(self.decoder_layers, cache.keys, cache.values, strict=True):
            x = layer.forward_cached(x, k_ctx, v_ctx, rope_q)
        return self.norm(x)[0]

    @torch.no_grad()
    def draft_after(self, cache: ContextCache, anchor_token: int) -> Tensor:
        """Greedy tokens (block - 1,) for slots 1.. of the block anchored at position `cache.length`."""
        out = self.hidden_after(cache, anchor_token)[1:]
        return F.linear(out, self.lm_head_weight.to(out.dtype)).argmax(-1)

    def forward(
        self, input_ids: Tensor, loss_mask: Tensor, hidden: Tensor, anchors: Tensor, anchor_valid: Tensor
    ) -> LossOutput:
        """The whole drafter step up to the loss (one module call, so DDP's hooks see it)."""
        out = self.draft_hidden(input_ids, hidden, anchors, anchor_valid)
        labels, supervised = block_targets(input_ids, loss_mask, anchors, anchor_valid, self.cfg.block_size)
        return dflash_loss(
            out,
            self.lm_head_weight,
            labels,
            supervised,
            anchor_valid,
            self.gamma,
            self.loss_chunk,
            self.compile_loss,
        )
