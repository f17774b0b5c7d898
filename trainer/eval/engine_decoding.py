"""`eval` on the engine: a prompt set decoded three ways with the same kernels and graphs (target-only greedy,
the drafter, prompt lookup), so every ratio compares like with like.

Two uses of one function (`decode_with`):
- **tau over a whole set**: every prompt at once (as many slots as prompts, up to `TAU_SLOTS`), continuous
  batching; what each prompt emitted and how (per row: verify forwards, how many drafted, the histogram of
  tokens emitted per forward);
- **latency at a fixed batch**: `batch` requests in flight (a slot that ends takes the next), the host looking
  at every step as a server does; generated tokens over the run's wall time, after a warm-up run on the same
  slots (Triton's compiles and the graphs' capture are not in it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from trainer.engine.decoder import KVDecoder
from trainer.engine.drafting import proposer_for
from trainer.engine.scheduler import Scheduler
from trainer.engine.speculative import SpeculativeDecoder
from trainer.model.drafter import DFlashDrafter

TAU_SLOTS_GPU = 256  # rows at once for tau over a set on a GPU (a verify's logits: slots x B x vocab)
TAU_SLOTS_CPU = 8
TARGET_ONLY = "target"  # the `drafter` name of target-only greedy decoding in the figures


@dataclass
class Decoding:
    """One way of decoding a prompt set: what each prompt emitted, and what it cost."""

    drafter: str  # target | dflash | ngram
    tokens: list[list[int]]
    figures: list[dict[str, Any]]  # per prompt: forwards, drafted, emitted ({} for target-only)
    seconds: float  # wall time of the run (prefill and decode, synced)
    slots: int
    graphs: int
    steps: int = 0  # decode steps (a verify forward each for the speculative ways)
    decode_seconds: float = 0.0  # of `seconds`, the decode steps' (the prefills' apart)

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class EngineDecoders:
    """The target (and the drafter) on one device, and a decoder per (way, slots), made once and kept: a
    latency row's warm-up captures the graphs its timed run replays."""

    def __init__(
        self,
        model: Any,
        drafter: DFlashDrafter | None,
        max_len: int,
        stops: list[int],
        ngram: tuple[int, int, int],
    ) -> None:
        self.model, self.drafter, self.max_len, self.stops, self.ngram = model, drafter, max_len, stops, ngram
        self.device = next(model.parameters()).device
        self._made: dict[tuple[str, int], Any] = {}

    def decoder(self, drafter: str, slots: int) -> Any:
        """A `KVDecoder` (target-only) or a `SpeculativeDecoder` (dflash, ngram) of `slots` rows."""
        key = (drafter, slots)
        if key not in self._made:
            self._made.clear()  # one decoder's cache at a time
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            layers = list(self.drafter.cfg.target_layer_ids) if drafter == "dflash" and self.drafter else []
            decoder: Any = KVDecoder(self.model, slots, self.max_len, capture_layers=layers)
            if drafter != TARGET_ONLY:
                decoder = SpeculativeDecoder(
                    decoder, proposer_for(drafter, self.drafter, decoder, self.ngram)
                )
            self._made[key] = decoder
        return self._made[key]

    def decode_with(
        self,
        drafter: str,
        prompts: list[list[int]],
        max_new: int,
        slots: int,
        sync_every: int,
        on_tokens: Any = None,
    ) -> Decoding:
        """Every prompt decoded `drafter`'s way on `slots` rows; its wall time, synced at both ends."""
        decoder = self.decoder(drafter, slots)
        scheduler = Scheduler(
            decoder, prompts, max_new, self.stops, sync_every=sync_every, on_tokens=on_tokens
        )
        _sync(self.device)
        began = time.perf_counter()
        tokens, stats = scheduler.run()
        _sync(self.device)
        seconds = time.perf_counter() - began
        return Decoding(
            drafter,
            tokens,
            scheduler.figures,
            seconds,
            decoder.slots,
            stats.graphs,
            stats.steps,
            stats.decode_s,
        )

    def latency(self, drafter: str, prompts: list[list[int]], max_new: int, batch: int) -> Decoding:
        """`batch` requests in flight over `prompts`, after an untimed warm-up on the same decoder."""
        self.decode_with(drafter, prompts[:batch], min(max_new, 2 * self.block_of(drafter)), batch, 1)
        return self.decode_with(drafter, prompts, max_new, batch, 1)

    def block_of(self, drafter: str) -> int:
        if drafter == "dflash" and self.drafter is not None:
            return self.drafter.cfg.block_size
        return self.ngram[0] + 1 if drafter == "ngram" else 1


def tau_slots(device: torch.device, prompts: int) -> int:
    """Rows at once for tau over a set: every prompt, up to the device's cap."""
    cap = TAU_SLOTS_GPU if device.type == "cuda" else TAU_SLOTS_CPU
    return max(1, min(cap, prompts))
