"""What proposes a block's tokens for the target to verify: the trained DFlash drafter, or prompt lookup
(vLLM's `ngram` method, the training-free baseline a user would otherwise pick). Both run through the same
verify loop (`trainer.eval.speculative`), so their acceptance is measured the same way on the same prompts."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from trainer.model.drafter import ContextCache, DFlashDrafter


class Proposer(Protocol):
    name: str
    max_draft: int  # the most tokens one block proposes (a block of B verifies B - 1 of them)
    needs_features: bool  # whether it reads the target's captured layers

    def start(self) -> None:
        """A new sequence begins: forget whatever the last one left (a proposer may keep state across
        the blocks of one sequence)."""
        ...

    def propose(self, ids: list[int], features: Tensor | None) -> list[int]:
        """Up to `max_draft` tokens to follow `ids` (the last one is the last accepted token)."""
        ...


class DFlashProposer:
    """The exported drafter: one forward proposes slots 1..B-1 from the last accepted token (slot 0) and the
    captured features of every position before it. Each position's context keys and values are projected
    once per sequence and cached (`ContextCache`), as serving engines do, not once per block."""

    name = "dflash"
    needs_features = True

    def __init__(self, drafter: DFlashDrafter) -> None:
        self.drafter = drafter
        self.max_draft = drafter.cfg.block_size - 1
        self.cache = ContextCache()

    def start(self) -> None:
        self.cache = ContextCache()

    def propose(self, ids: list[int], features: Tensor | None) -> list[int]:
        assert features is not None, "the drafter reads the target's captured layers"
        # features: positions 0..len(ids)-2 (the last token, the anchor, has not been through the target)
        if features.shape[1] != len(ids) - 1 or features.shape[1] < self.cache.length:
            raise ValueError(
                f"{features.shape[1]} captured positions for {len(ids)} tokens with {self.cache.length} "
                "cached: call start() before each sequence"
            )
        if features.shape[1] > self.cache.length:
            self.drafter.extend_context(self.cache, features[:, self.cache.length :])
        return self.drafter.draft_after(self.cache, ids[-1]).tolist()


class WholeContextProposer:
    """The reference for `DFlashProposer`: `draft_tokens` over the whole context at every block (the context
    re-projected each time), the batched path the held-out walk scores with. Same drafts; kept for the
    equivalence tests and `bench/decode/context_cache.py`, not for decoding."""

    name = "dflash, whole context"
    needs_features = True

    def __init__(self, drafter: DFlashDrafter) -> None:
        self.drafter, self.max_draft = drafter, drafter.cfg.block_size - 1

    def start(self) -> None:
        pass

    def propose(self, ids: list[int], features: Tensor | None) -> list[int]:
        assert features is not None, "the drafter reads the target's captured layers"
        device = features.device  # the anchor's own feature row: a zero the mask never lets through
        context = torch.cat([features, features.new_zeros(1, 1, features.shape[-1])], dim=1)
        anchor = torch.tensor([[len(ids) - 1]], device=device)
        one = torch.ones(1, 1, dtype=torch.bool, device=device)
        drafted = self.drafter.draft_tokens(torch.tensor([ids], device=device), context, anchor, one)
        return drafted[0, 0].tolist()


class PromptLookup:
    """Prompt lookup (vLLM's `ngram` speculative method): find the longest n in [n_min, n_max] whose last n
    tokens occurred earlier in the context (prompt and output so far; the earliest such occurrence), and
    propose the up-to-k tokens that followed it; nothing when no n-gram matches."""

    name = "ngram"
    needs_features = False

    def __init__(self, k: int, n_min: int = 1, n_max: int = 4) -> None:
        if not (k >= 1 and 1 <= n_min <= n_max):
            raise ValueError(f"prompt lookup needs k >= 1 and 1 <= n_min <= n_max, got {k}, {n_min}, {n_max}")
        self.max_draft, self.n_min, self.n_max = k, n_min, n_max

    def start(self) -> None:
        pass  # stateless: every proposal reads the whole context

    def propose(self, ids: list[int], features: Tensor | None = None) -> list[int]:
        return lookup(ids, self.max_draft, self.n_min, self.n_max)


def lookup(ids: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """The tokens that followed the earliest earlier occurrence of the longest matching suffix n-gram."""
    total = len(ids)
    for n in range(min(n_max, total - 1), n_min - 1, -1):
        suffix = ids[total - n :]
        for start in range(total - n):  # earlier occurrences only (the suffix itself starts at total - n)
            if ids[start : start + n] == suffix:
                return ids[start + n : start + n + k]
    return []
