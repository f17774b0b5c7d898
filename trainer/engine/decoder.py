"""The target's decode path over a KV cache of our own: `slots` rows of `max_len` positions, preallocated once,
each row at its own length, so that a finished row can take the next prompt while the others go on.

It runs the Hugging Face model's own modules (embedding, norms, projections, MLPs, head) and replaces only
attention and the cache, for the families whose layer is exactly "norm, attention with RoPE, residual, norm,
MLP, residual" (trainer.engine.support says which). A forward feeds T tokens per slot at the slot's own
positions (`forward_rows`): one for a decode step, a block for a speculative verify (trainer.engine.speculative),
which also keeps the outputs of the layers a drafter reads (`capture_layers`). A decode step feeds one token per slot, chooses each slot's next token and does the job's bookkeeping on the
device (the answer buffer, each row's count, which rows ended), so the host need not look at every step: it
reads the slots' state every few steps (trainer.engine.scheduler). Attention reads each row's own length
(trainer.kernels.cached_attention's Triton kernel) where Triton runs; elsewhere SDPA attends over the first
`length` positions, `length` a multiple of `LENGTH_BUCKET` covering the longest row. On CUDA the step is
captured once (per attended length on the SDPA path) as a CUDA graph and replayed (a 30-layer step is ~450
small kernels: launched one by one they cost more than the step's arithmetic at a 135M target's shapes).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F

from trainer.engine.graphs import StepGraphs
from trainer.engine.sampling import choose_tokens
from trainer.kernels.cached_attention import cached_attention, triton_available

LENGTH_BUCKET = 128  # SDPA path: a step attends over a multiple of this many positions (few graphs)
MAX_STOPS = (
    8  # stop tokens the device-side step checks (more: the buffer grows and the graphs are re-captured)
)


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """Bytes of K and V one position holds over all layers."""
    heads = config.num_key_value_heads or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * torch.finfo(dtype).bits // 8


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in transformers' (non-interleaved) layout."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class KVDecoder:
    """Prefill prompts into free slots; decode one token for every slot at a time, or run a block of tokens per
    slot through the target (a speculative verify)."""

    tokens_per_step = 1  # how far one `step` can move a row (the scheduler's bound on the rows' positions)

    def __init__(
        self,
        model: Any,
        slots: int,
        max_len: int,
        graphs: bool | None = None,
        capture_layers: list[int] | None = None,
    ) -> None:
        self.model = model
        config = model.config
        self.base = model.model
        self.layers = list(self.base.layers)
        weight = next(model.parameters())
        self.device, self.dtype = weight.device, weight.dtype
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.group = self.heads // self.kv_heads
        self.slots = slots
        self.max_len = -(-max_len // LENGTH_BUCKET) * LENGTH_BUCKET
        self.capture_layers = list(
            capture_layers or []
        )  # whose outputs a forward keeps (a drafter's context)
        shape = (slots, self.kv_heads, self.max_len, self.head_dim)
        self.keys = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers]
        self.values = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers]
        with torch.inference_mode():
            positions = torch.arange(self.max_len, device=self.device)[None]
            probe = torch.zeros(1, device=self.device, dtype=self.dtype)
            cos, sin = self.base.rotary_emb(probe, positions)
        self.cos, self.sin = cos[0], sin[0]  # (max_len, head_dim)
        # The step's inputs, read in place by every captured graph: each slot's pending token (the last it chose,
        # not yet through the target) and that token's position.
        self.tokens = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.positions = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.rows = torch.arange(slots, device=self.device)
        # DFLASH_DOCTOR_GRAPHS=0 runs the steps eagerly on a GPU too (to tell a graph's fault from a step's)
        default = self.device.type == "cuda" and os.environ.get("DFLASH_DOCTOR_GRAPHS", "1") != "0"
        self.use_graphs = default if graphs is None else graphs
        self.graphs = StepGraphs(self.device)
        self.exact_lengths = triton_available(self.device.type)  # attention reads each row's own length
        # The job's state on the device, updated by every step (see `_advance`).
        self.live = torch.zeros(slots, dtype=torch.bool, device=self.device)
        self.produced = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.answers = torch.zeros((slots, self.max_len), dtype=torch.long, device=self.device)
        self.row_keys = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.max_new = torch.zeros((), dtype=torch.long, device=self.device)
        self.stops = torch.full((MAX_STOPS,), -1, dtype=torch.long, device=self.device)
        self.live_row_steps = torch.zeros((), dtype=torch.long, device=self.device)
        self.attended_positions = torch.zeros((), dtype=torch.long, device=self.device)
        self.temperature, self.top_p = 0.0, 1.0

    def configure(self, max_new_tokens: int, stop_ids: Any, temperature: float, top_p: float) -> None:
        """Set a job's limits and choice rule; clear the slots and the counters."""
        stops = sorted(set(int(t) for t in stop_ids))
        if len(stops) > self.stops.numel():
            self.stops = torch.full((len(stops),), -1, dtype=torch.long, device=self.device)
            self.graphs.clear()  # the captured steps read the old buffer
        self.stops.fill_(-1)
        if stops:
            self.stops[: len(stops)] = torch.tensor(stops, device=self.device)
        self.max_new.fill_(max_new_tokens)
        self.temperature, self.top_p = float(temperature), float(top_p)
        for state in (self.live, self.produced, self.positions, self.live_row_steps, self.attended_positions):
            state.zero_()

    def job_state(self) -> list[torch.Tensor]:
        """The tensors a step changes (what capturing a step must leave as it found them)."""
        state = [self.live, self.produced, self.positions, self.tokens, self.answers]
        return [*state, self.live_row_steps, self.attended_positions]

    def _attention_projections(
        self, attn: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (n, heads, t, d), k and v (n, kv_heads, t, d), RoPE applied; h is (n, t, hidden)."""
        n, t = h.shape[:2]
        q = attn.q_proj(h).view(n, t, self.heads, self.head_dim)
        k = attn.k_proj(h).view(n, t, self.kv_heads, self.head_dim)
        v = attn.v_proj(h).view(n, t, self.kv_heads, self.head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3 normalises each head before RoPE
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The target's head over final hidden states (..., hidden) -> (..., vocab)."""
        return self.model.lm_head(self.base.norm(x))

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]], slots: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Write the prompts' K/V into `slots` (from position 0); return the logits after each prompt's last
        token (n, vocab) and, with `capture_layers`, the captured layers' outputs at every prompt position
        (n, width, n_layers * hidden). Prompts are right-padded: what a pad writes past a prompt's end is never
        attended (a row attends up to its own position) and is overwritten as the row decodes."""
        n, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.zeros((n, width), dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, : len(p)] = torch.tensor(p, dtype=torch.long)
        ids = ids.to(self.device)
        where = torch.tensor(slots, device=self.device)
        cos, sin = self.cos[:width], self.sin[:width]
        x = self.base.embed_tokens(ids)
        kept: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = self._attention_projections(attn, layer.input_layernorm(x), cos, sin)
            self.keys[i][where, :, :width] = k
            self.values[i][where, :, :width] = v
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=attn.scaling, enable_gqa=True)
            x = x + attn.o_proj(o.transpose(1, 2).reshape(n, width, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if i in self.capture_layers:
                kept[i] = x
        last = torch.tensor([len(p) - 1 for p in prompts], device=self.device)
        features = torch.cat([kept[i] for i in self.capture_layers], -1) if kept else None
        return self.logits(x[torch.arange(n, device=self.device), last]), features

    @torch.inference_mode()
    def start_rows(self, prompts: list[list[int]], slots: list[int], keys: list[int]) -> torch.Tensor | None:
        """Prefill `prompts` into `slots`, choose each one's first token and make the rows live (a row whose
        first token already ends it stays idle, its one token in `answers`). Returns the prefill's captured
        features (None without `capture_layers`)."""
        logits, features = self.prefill(prompts, slots)
        where = torch.tensor(slots, device=self.device)
        row_keys = torch.tensor(keys, dtype=torch.long, device=self.device)
        first = choose_tokens(logits, self.temperature, self.top_p, row_keys, torch.zeros_like(row_keys))
        self.row_keys[where] = row_keys
        self.answers[where, 0] = first
        self.produced[where] = 1
        self.tokens[where] = first
        ended = self.stopped(first) | (self.max_new <= 1)
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        self.positions[where] = torch.where(ended, 0, lengths)
        self.live[where] = ~ended
        return features

    def stopped(self, tokens: torch.Tensor) -> torch.Tensor:
        """Whether each token is a stop token (any shape)."""
        return (tokens[..., None] == self.stops).any(dim=-1)

    def forward_rows(self, ids: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every slot's `T` tokens `ids` (slots, T) at its positions `positions .. positions + T - 1`: their K/V
        written into the cache, each attending its row's cache up to itself (causal). Returns the last layer's
        output (slots, T, hidden) and the captured layers' (slots, T, n_layers * hidden) or None.

        Attention reads each row's own length (the Triton kernel) or, on the SDPA path, the cache's first
        `length` positions under a mask."""
        s, t = ids.shape
        at = self.positions[:, None] + torch.arange(t, device=self.device)  # (slots, T)
        at = at.clamp(max=self.max_len - 1)  # an idle row's block stays inside the cache
        cos, sin = self.cos[at][:, None], self.sin[at][:, None]  # (slots, 1, T, d)
        lengths = self.positions + t
        span = None if self.exact_lengths else length
        x = self.base.embed_tokens(ids)  # (slots, T, hidden)
        kept: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = self._attention_projections(attn, layer.input_layernorm(x), cos, sin)
            self.keys[i][self.rows[:, None], :, at] = k.transpose(1, 2)
            self.values[i][self.rows[:, None], :, at] = v.transpose(1, 2)
            o = cached_attention(
                q.transpose(1, 2), self.keys[i], self.values[i], lengths, attn.scaling, span=span
            )
            x = x + attn.o_proj(o.reshape(s, t, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if i in self.capture_layers:
                kept[i] = x
        features = torch.cat([kept[i] for i in self.capture_layers], -1) if kept else None
        return x, features

    def _advance(self, logits: torch.Tensor, lengths: torch.Tensor) -> None:
        """The step's bookkeeping, on the device: each live row's next token into `answers`, its count, whether
        it ended (a stop token or `max_new`); the next step's tokens and positions (an idle row computes at
        position 0, which a prefill writes before it is read)."""
        live = self.live
        token = choose_tokens(logits, self.temperature, self.top_p, self.row_keys, self.produced)
        at = self.produced.clamp(max=self.max_len - 1)[:, None]
        self.answers.scatter_(1, at, torch.where(live[:, None], token[:, None], self.answers.gather(1, at)))
        ended = live & (self.stopped(token) | (self.produced + 1 >= self.max_new))
        self.live_row_steps += live.sum()
        self.attended_positions += (lengths * live).sum()
        self.produced += live
        self.tokens.copy_(torch.where(live, token, self.tokens))
        still = live & ~ended
        self.positions.copy_(torch.where(still, self.positions + 1, 0))
        self.live.copy_(still)

    def _step(self, length: int) -> None:
        """One token per slot at its own position, then `_advance`."""
        x, _ = self.forward_rows(self.tokens[:, None], length)
        self._advance(self.logits(x)[:, 0], self.positions + 1)

    def bucket(self, longest: int) -> int:
        """The attended length for a step whose longest row is at position `longest - 1` (SDPA path; the
        kernel's steps read each row's own length and share one graph)."""
        if self.exact_lengths:
            return 0
        return min(self.max_len, max(LENGTH_BUCKET, -(-longest // LENGTH_BUCKET) * LENGTH_BUCKET))

    @torch.inference_mode()
    def step(self, length: int) -> None:
        """Decode one token for every live slot (`start_rows` and `configure` beforehand)."""
        if not self.use_graphs:
            self._step(length)
            return
        key = ("decode", length, self.temperature, self.top_p)
        self.graphs.replay(key, lambda: self._step(length), self.job_state())

    @property
    def graphs_captured(self) -> int:
        return len(self.graphs)
