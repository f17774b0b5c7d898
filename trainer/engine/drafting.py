"""What proposes a block inside the engine: the trained DFlash drafter over a static context cache, or prompt
lookup over each row's tokens, both on the device for every slot at once, so a speculative step needs no host
look (and is captured as one CUDA graph with the verify forward it feeds).

A proposer follows the rows through three calls (trainer.engine.speculative drives them):
- `start_rows(where, prompts, features)` after a prefill: the prompts' tokens and the target's captured layers
  at every prompt position;
- `propose(tokens, positions)` before a verify: up to `max_draft` tokens per slot to follow its pending token
  (at `positions`), and how many of them count;
- `accept(features, positions, emitted, counts)` after it: the verify's captured layers at the B positions
  it fed, and the tokens each row emitted (`counts` of them: what is past a row's count was rejected).

The drafter here computes what `trainer.eval.proposers.DFlashProposer` computes one sequence at a time (the
same modules: `fc`, `hidden_norm`, each layer's context and block projections, `block_inputs`), with each
row's context keys and values kept in a preallocated cache at their positions instead of a growing list.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from trainer.kernels.cached_attention import cached_attention
from trainer.model.drafter import DFlashDrafter, rope_cos_sin


class DrafterProposer:
    """The exported drafter, every slot's block at once over a context cache of `slots` x `max_len` positions."""

    name = "dflash"

    def __init__(self, drafter: DFlashDrafter, slots: int, max_len: int, exact_lengths: bool) -> None:
        self.drafter = drafter
        cfg = drafter.cfg
        self.max_draft = cfg.block_size - 1
        self.layer_ids = list(cfg.target_layer_ids)
        weight = drafter.fc.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.max_len = max_len
        shape = (slots, cfg.num_key_value_heads, max_len, cfg.head_dim)
        layers = drafter.decoder_layers
        self.keys = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in layers]
        self.values = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in layers]
        self.rows = torch.arange(slots, device=self.device)
        self.scale = cfg.head_dim**-0.5
        self.exact_lengths = exact_lengths  # the kernel reads each row's own length; else SDPA over `span`

    def _write_context(self, rows: Tensor, positions: Tensor, features: Tensor) -> None:
        """Every layer's context keys and values for `features` (n, T, n_layers * H) of `rows` (n,) at
        `positions` (n, T)."""
        drafter = self.drafter
        context = drafter.hidden_norm(drafter.fc(features.to(self.dtype)))  # (n, T, H)
        rope = rope_cos_sin(positions, drafter.inv_freq)  # (n, T, D) each
        for i, layer in enumerate(drafter.decoder_layers):
            k, v = layer.self_attn.context_kv(context, rope)  # (n, Hkv, T, D)
            self.keys[i][rows[:, None], :, positions] = k.transpose(1, 2)
            self.values[i][rows[:, None], :, positions] = v.transpose(1, 2)

    def start_rows(self, where: Tensor, prompts: list[list[int]], features: Tensor | None) -> None:
        assert features is not None, "the drafter reads the target's captured layers"
        width = features.shape[1]
        positions = torch.arange(width, device=self.device).expand(len(prompts), width)
        self._write_context(where, positions, features)  # past a prompt's end: overwritten before it is read

    def propose(self, tokens: Tensor, positions: Tensor, span: int) -> tuple[Tensor, Tensor]:
        """Slots 1..B-1 of the block anchored at each row's pending token: (slots, B-1) tokens, all counting.

        The block's own keys and values are written into the context cache at the block's positions (the
        verify's accepted features overwrite them before any later block reads them as context), so one
        attention call sees the row's context and its block: every key below `positions + B`, both ways."""
        drafter, block = self.drafter, self.max_draft + 1
        x, rope_q = drafter.block_inputs(tokens[:, None], positions[:, None])  # (slots, B, H), (slots, B, D)
        at = positions[:, None] + torch.arange(block, device=self.device)
        at = at.clamp(max=self.max_len - 1)
        lengths = positions + block
        for i, layer in enumerate(drafter.decoder_layers):
            attn = layer.self_attn
            q, k, v = attn.block_qkv(layer.input_layernorm(x), rope_q)  # (slots, H*, B, D)
            self.keys[i][self.rows[:, None], :, at] = k.transpose(1, 2)
            self.values[i][self.rows[:, None], :, at] = v.transpose(1, 2)
            o = cached_attention(
                q.transpose(1, 2), self.keys[i], self.values[i], lengths, self.scale, causal=False,
                span=None if self.exact_lengths else span,
            )  # fmt: skip
            x = x + attn.o_proj(o.reshape(x.shape[0], block, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        out = drafter.norm(x)[:, 1:]
        drafts = F.linear(out, drafter.lm_head_weight.to(out.dtype)).argmax(-1)
        return drafts, torch.full_like(positions, self.max_draft)

    def accept(self, features: Tensor | None, positions: Tensor, emitted: Tensor, counts: Tensor) -> None:
        """The verified positions' context: the target's layers at `positions .. positions + B - 1` (those past
        a row's accepted tokens are overwritten by its next block before they are read)."""
        assert features is not None, "the drafter reads the target's captured layers"
        at = positions[:, None] + torch.arange(features.shape[1], device=self.device)
        self._write_context(self.rows, at.clamp(max=self.max_len - 1), features)

    def state(self) -> list[Tensor]:
        """Tensors a step changes that a later step reads (none: what a step writes it rewrites the same)."""
        return []


class LookupProposer:
    """Prompt lookup (vLLM's `ngram` method) on the device: each row's longest suffix n-gram (n from `n_max`
    down to `n_min`) found earlier in its own tokens (prompt and output so far), its earliest occurrence, and up
    to `k` tokens that followed it; nothing when no n-gram matches. `trainer.eval.proposers.lookup` is the same
    rule over a Python list (the tests hold the two equal)."""

    name = "ngram"

    def __init__(
        self, k: int, n_min: int, n_max: int, slots: int, max_len: int, device: torch.device
    ) -> None:
        if not (k >= 1 and 1 <= n_min <= n_max):
            raise ValueError(f"prompt lookup needs k >= 1 and 1 <= n_min <= n_max, got {k}, {n_min}, {n_max}")
        self.max_draft, self.n_min, self.n_max = k, n_min, n_max
        self.layer_ids: list[int] = []  # reads no layer of the target
        self.device, self.max_len = device, max_len
        self.history = torch.zeros((slots, max_len), dtype=torch.long, device=device)  # tokens by position
        self.rows = torch.arange(slots, device=device)

    def start_rows(self, where: Tensor, prompts: list[list[int]], features: Tensor | None) -> None:
        width = max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, : len(p)] = torch.tensor(p, dtype=torch.long)
        self.history[where, :width] = ids.to(self.device)

    def propose(self, tokens: Tensor, positions: Tensor, span: int) -> tuple[Tensor, Tensor]:
        """(slots, k) tokens and how many of them count (0: no n-gram matched)."""
        history = self.history
        history.scatter_(
            1, positions[:, None].clamp(max=self.max_len - 1), tokens[:, None]
        )  # the pending token
        total = positions + 1  # tokens known per row: prompt, output, the pending one
        count = history.shape[1]
        starts = torch.arange(count, device=self.device)
        found = torch.zeros_like(positions, dtype=torch.bool)
        source = torch.zeros_like(positions)  # where the proposal's tokens start (the match's end)
        for n in range(self.n_max, self.n_min - 1, -1):
            suffix_at = (total[:, None] - n + torch.arange(n, device=self.device)).clamp(min=0)
            suffix = history.gather(1, suffix_at)  # (slots, n)
            windows = history.unfold(1, n, 1)  # (slots, count - n + 1, n)
            same = (windows == suffix[:, None]).all(-1)
            # earlier occurrences only (a start before the suffix's own), and an n-gram shorter than the context
            usable = (starts[None, : same.shape[1]] < (total - n)[:, None]) & (total - 1 >= n)[:, None]
            first = torch.where(same & usable, starts[None, : same.shape[1]], count).min(1).values
            hit = (first < count) & ~found
            source = torch.where(hit, first + n, source)
            found |= hit
        lengths = torch.where(found, (total - source).clamp(max=self.max_draft), 0)
        at = (source[:, None] + torch.arange(self.max_draft, device=self.device)).clamp(max=self.max_len - 1)
        return history.gather(1, at), lengths

    def accept(self, features: Tensor | None, positions: Tensor, emitted: Tensor, counts: Tensor) -> None:
        """The emitted tokens into each row's history, after its pending token (at `positions + 1 ...`)."""
        j = torch.arange(emitted.shape[1], device=self.device)
        at = (positions[:, None] + 1 + j).clamp(max=self.max_len - 1)
        keep = j[None] < counts[:, None]
        self.history.scatter_(1, at, torch.where(keep, emitted, self.history.gather(1, at)))

    def state(self) -> list[Tensor]:
        return [self.history]


def proposer_for(
    kind: str, drafter: DFlashDrafter | None, decoder: Any, ngram: tuple[int, int, int]
) -> DrafterProposer | LookupProposer:
    """The proposer `kind` ("dflash" or "ngram") for `decoder`'s slots and cache length."""
    if kind == "dflash":
        assert drafter is not None, "the drafter proposes only with an export loaded"
        return DrafterProposer(drafter, decoder.slots, decoder.max_len, decoder.exact_lengths)
    k, n_min, n_max = ngram
    return LookupProposer(k, n_min, n_max, decoder.slots, decoder.max_len, decoder.device)
