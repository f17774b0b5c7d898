"""Greedy decoding with the target alone, and greedy block speculative decoding with a drafter.

The loop, per prompt:
1. the target prefills the prompt (one forward): its greedy token is the first new token, and the
   captured layers' outputs are the drafter's context for every prompt position;
2. the drafter proposes a block from the last accepted token (slot 0 = that token, slots 1.. = the mask
   token; its context: the captured features of every position before it), one forward;
3. the target verifies the block in one forward (the last accepted token + the B-1 drafted ones);
4. the longest prefix of drafted tokens equal to the target's own greedy choices is accepted, plus the
   target's next token (the bonus token): 1..B tokens per verify forward, the acceptance length;
5. the KV cache is cut back to the accepted tokens, the drafter's context grows by their features;
   repeat until the new-token budget (or the end-of-sequence token).

The tokens equal target-only greedy decoding's by construction (every emitted token is the target's
greedy choice after the emitted prefix), exactly so in fp32. In bf16 a B-token verify forward and a 1-token
forward round differently and can flip a near-tie; both decodes keep the target's top-k logits at every
emitted token, and `trainer.eval.compare` tells such a flip (`tie`) from a real difference (`different`).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from trainer.eval.compare import TOP_K, TopChoices
from trainer.eval.proposers import Proposer
from trainer.target_model.capture import LayerOutputs
from trainer.target_model.load import cache_argument, returned_cache


@dataclass
class Decoded:
    """One prompt decoded one way."""

    tokens: list[int]
    target_forwards: int
    seconds: float
    accepted: list[int] = field(
        default_factory=list
    )  # per verify forward: tokens it emitted (1..B), cut at the end
    top: list[TopChoices] = field(default_factory=list)  # per token: the target's top-k where it chose it
    proposed: list[int] = field(default_factory=list)  # per verify forward (as `accepted`): tokens drafted


@dataclass
class TargetStep:
    """One target forward, reduced to what decoding needs (per input position)."""

    greedy: Tensor  # (L,) the target's greedy next token
    top_logits: Tensor  # (L, k) its k highest logits, highest first
    top_ids: Tensor  # (L, k)
    features: Tensor | None  # (1, L, F) the captured layers' outputs (None: no layers captured)
    cache: Any

    def top(self, rows: slice) -> list[TopChoices]:
        """The top-k at these positions, on the host."""
        logits, ids = self.top_logits[rows].float().tolist(), self.top_ids[rows].tolist()
        return [TopChoices(tuple(i), tuple(v)) for i, v in zip(ids, logits, strict=True)]


class SpecTarget:
    """The full target (causal LM) with forward hooks on the drafter's captured layers."""

    def __init__(self, model: Any, layer_ids: list[int]) -> None:  # a Hugging Face causal LM
        self.model = model.eval().requires_grad_(False)
        self.layer_ids = list(layer_ids)
        self.outputs = LayerOutputs(model.model.layers, self.layer_ids) if self.layer_ids else None
        self.cache_name = cache_argument(model)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def close(self) -> None:
        """Remove the capture hooks (the engine decodes the same model without them)."""
        if self.outputs is not None:
            self.outputs.close()
            self.outputs = None

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def logits(self, ids: Tensor, cache: Any) -> tuple[Tensor, Tensor | None, Any]:
        """(logits (L, V), captured features (1, L, F) or None, the cache) for `ids` (1, L) after the cache."""
        if self.outputs is not None:
            self.outputs.clear()
        out = self.model(
            input_ids=ids, use_cache=True, **({self.cache_name: cache} if cache is not None else {})
        )
        features = self.outputs.take() if self.outputs is not None else None
        return out.logits[0], features, returned_cache(out, self.cache_name)

    def forward(self, ids: Tensor, cache: Any) -> TargetStep:
        """The greedy token and top-k logits per position (a topk on rows computed anyway), features, cache."""
        logits, features, cache = self.logits(ids, cache)
        top = logits.topk(TOP_K, dim=-1)
        return TargetStep(logits.argmax(-1), top.values, top.indices, features, cache)


def keep_first(cache: Any, length: int) -> None:
    """Cut a transformers cache back to its first `length` positions (the rejected draft's are dropped)."""
    remove = cache.get_seq_length() - length
    if remove <= 0:
        return
    if "tokens_to_remove" in inspect.signature(cache.crop).parameters:
        cache.crop(-remove)  # transformers >= 5: a negative count
    else:
        cache.crop(length)  # older: the length to keep


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


Stops = int | Collection[int] | None  # where an answer ends: an end-of-sequence id, several, or none


def _stops(eos: Stops) -> frozenset[int]:
    if eos is None:
        return frozenset()
    return frozenset([eos]) if isinstance(eos, int) else frozenset(eos)


def _finish(tokens: list[int], max_new: int, eos: Stops) -> int:
    """How many of the emitted tokens count: at most max_new, up to and including the first stop token."""
    stops = _stops(eos)
    tokens = tokens[:max_new]
    return next((i + 1 for i, t in enumerate(tokens) if t in stops), len(tokens))


@torch.inference_mode()
def greedy_decode(target: SpecTarget, prompt: list[int], max_new: int, eos: Stops) -> Decoded:
    """Target-only greedy decoding with a KV cache: one forward per token."""
    device = target.device
    _sync(device)
    began = time.perf_counter()
    step = target.forward(torch.tensor([prompt], device=device), None)
    tokens, top = [int(step.greedy[-1])], step.top(slice(-1, None))
    forwards = 1
    stops = _stops(eos)
    while len(tokens) < max_new and tokens[-1] not in stops:
        step = target.forward(torch.tensor([[tokens[-1]]], device=device), step.cache)
        tokens.append(int(step.greedy[-1]))
        top += step.top(slice(-1, None))
        forwards += 1
    _sync(device)
    n = _finish(tokens, max_new, eos)
    return Decoded(tokens[:n], forwards, time.perf_counter() - began, top=top[:n])


@torch.inference_mode()
def speculative_decode(
    target: SpecTarget, proposer: Proposer, prompt: list[int], max_new: int, eos: Stops
) -> Decoded:
    """Greedy block speculative decoding (see the module docstring) with any proposer: the drafter, or
    prompt lookup. A block that proposes nothing is one plain decoding step."""
    device = target.device
    _sync(device)
    began = time.perf_counter()
    proposer.start()
    step = target.forward(torch.tensor([prompt], device=device), None)
    features, cache = step.features, step.cache
    ids, top = [*prompt, int(step.greedy[-1])], step.top(slice(-1, None))
    forwards, accepted, proposed = 1, [], []
    stops = _stops(eos)
    ended = ids[-1] in stops
    while len(ids) - len(prompt) < max_new and not ended:
        n = len(ids)
        draft = proposer.propose(ids, features)[: proposer.max_draft]
        step = target.forward(torch.tensor([[ids[-1], *draft]], device=device), cache)
        cache = step.cache
        choices = step.greedy.tolist()  # the target's choice after each block position
        k = 0
        while k < len(draft) and draft[k] == choices[k]:
            k += 1
        ids.extend([*draft[:k], choices[k]])
        ended = not stops.isdisjoint(ids[n:])  # an accepted stop token ends it, wherever it sits
        top += step.top(slice(0, k + 1))  # the rows that chose the k + 1 emitted tokens
        if features is not None and step.features is not None:
            features = torch.cat([features, step.features[:, : k + 1]], dim=1)
        keep_first(cache, n + k)
        forwards += 1
        accepted.append(k + 1)
        proposed.append(len(draft))
    _sync(device)
    tokens = ids[len(prompt) :]
    n = _finish(tokens, max_new, eos)
    kept = emitted(accepted, n - 1)
    return Decoded(tokens[:n], forwards, time.perf_counter() - began, kept, top[:n], proposed[: len(kept)])


def emitted(accepted: list[int], kept: int) -> list[int]:
    """The verify forwards' acceptance lengths, counting only tokens that were emitted: the last forward
    may accept tokens past the budget or the end-of-sequence token, which are then dropped (`kept`: the
    tokens the verify forwards contributed to the output, the prefill's first token apart)."""
    out, total = [], 0
    for length in accepted:
        if total >= kept:
            break
        out.append(min(length, kept - total))
        total += out[-1]
    return out
