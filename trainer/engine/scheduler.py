"""Continuous batching over a decoder: every slot decodes one answer, and a slot whose answer ended takes the
next prompt, so no batch waits for its longest answer (on the H200, 36% of a SmolLM2 job's answers ran to the
384-token cap while most rows finished far earlier, idle until the batch ended).

The shape of vLLM's engine loop, in three named steps the host runs in turn: `update_from_output` (take the
answers of rows that ended; their slots become free), `schedule` (admit waiting prompts into free slots: a
prefill), `decode` (a few steps on the device with no host look between them). Prompts are taken longest first
(refills of similar length pad little), admitted in groups once a sixteenth of the slots is free (a prefill of a
handful of prompts costs most of a step), and each group's prefill is split to hold at most `prefill_tokens`
tokens. A row stops at a stop token or at `max_new_tokens`.

The decoder is a `KVDecoder` (one token a step) or a `SpeculativeDecoder` (a verified block a step): the
scheduler only knows how far one step can move a row (`tokens_per_step`), and asks a decoder that keeps
per-row figures for them as rows end (`row_figures`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

PREFILL_TOKENS = 32768  # tokens in one prefill forward: its activations stay a small share of memory
SYNC_EVERY = 8  # decode steps between the host's looks at the slots (answers run to hundreds of steps)


@dataclass
class DecodeStats:
    """What the job cost, for its rate and its roofline."""

    steps: int = 0
    row_steps: int = 0  # slots that decoded a live row, summed over steps
    slot_steps: int = 0  # slots computed, live or idle
    attended: int = 0  # positions live rows attended, summed (the KV cache a perfect kernel reads)
    attended_padded: int = 0  # positions the steps attended, slots x length, summed (what they read)
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    generated: int = 0
    graphs: int = 0
    lengths: set[int] = field(default_factory=set)

    def add(self, other: DecodeStats) -> None:
        for name in ("steps", "row_steps", "slot_steps", "attended", "attended_padded", "prefill_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.prefill_s += other.prefill_s
        self.decode_s += other.decode_s
        self.generated += other.generated
        self.graphs = max(self.graphs, other.graphs)
        self.lengths |= other.lengths


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Scheduler:
    """Decodes `prompts` to their answers on `decoder`'s slots (see the module docstring).

    The device does each step's bookkeeping; the host looks every `sync_every` steps: a row that ends between
    looks idles until the next one (a few steps of a few hundred), which is what the host's absence from the
    other steps buys.

    `on_tokens(n)`: the tokens generated since the last call, at each look. Counted from what a look copies
    anyway (live rows' positions, ended rows' answers), so it adds no host sync to the decode loop: a progress
    bar moves every `sync_every` steps instead of when the whole call ends (issue 39 U3)."""

    def __init__(
        self,
        decoder: Any,  # a KVDecoder or a SpeculativeDecoder
        prompts: Sequence[list[int]],
        max_new_tokens: int,
        stop_ids: Sequence[int],
        temperature: float = 0.0,
        top_p: float = 1.0,
        keys: Sequence[int] | None = None,
        prefill_tokens: int = PREFILL_TOKENS,
        sync_every: int = SYNC_EVERY,
        on_tokens: Callable[[int], None] | None = None,
    ) -> None:
        reach = (
            max_new_tokens + decoder.tokens_per_step - 1
        )  # the positions a row's steps write past its prompt
        if any(len(p) + reach > decoder.max_len for p in prompts):
            raise ValueError("a prompt and its answer do not fit the decoder's max_len")
        self.decoder, self.prompts = decoder, prompts
        self.prefill_tokens, self.sync_every, self.on_tokens = prefill_tokens, sync_every, on_tokens
        decoder.configure(max_new_tokens, stop_ids, temperature, top_p)
        slots = decoder.slots
        self.stats = DecodeStats()
        self.waiting = deque(sorted(range(len(prompts)), key=lambda i: -len(prompts[i])))
        self.results: list[list[int]] = [[] for _ in prompts]
        self.figures: list[dict[str, Any]] = [
            {} for _ in prompts
        ]  # per prompt, from a decoder that keeps them
        self.job = np.full(slots, -1, dtype=np.int64)  # the prompt each slot answers (-1: free)
        self.position = np.zeros(
            slots, dtype=np.int64
        )  # an upper bound on each slot's position (SDPA bucket)
        self.prompt_len = np.zeros(slots, dtype=np.int64)  # the prompt length of the row each slot answers
        self.reported = self.finished = 0  # tokens already passed to on_tokens; tokens of answers collected
        self.key_of = list(keys) if keys is not None else [0] * len(prompts)
        self.refill_at = max(1, slots // 16)

    @property
    def busy(self) -> int:
        return int((self.job >= 0).sum())

    def run(self) -> tuple[list[list[int]], DecodeStats]:
        """The new token ids of every prompt (its stop token included when it stopped), in input order."""
        while True:
            self.update_from_output()
            if self.schedule():
                continue  # a row can end at its first token: look again before decoding
            if not self.busy:
                break
            self.decode()
        return self.results, self.finish()

    def update_from_output(self) -> None:
        """Take the answers of rows that ended since the last look; their slots become free."""
        decoder = self.decoder
        live = decoder.live.cpu().numpy()
        self.position[:] = decoder.positions.cpu().numpy()
        ended = np.flatnonzero((self.job >= 0) & ~live)
        if ended.size:
            where = torch.as_tensor(ended, device=decoder.device)
            counts = decoder.produced[where].cpu().tolist()
            answers = decoder.answers[where, : max(counts)].cpu().tolist()
            figures = decoder.row_figures(where) if hasattr(decoder, "row_figures") else [{}] * len(counts)
            for row, count, answer, extra in zip(ended.tolist(), counts, answers, figures, strict=True):
                self.results[self.job[row]] = answer[:count]
                self.figures[self.job[row]] = extra
            self.job[ended] = -1
            self.finished += sum(counts)
        if self.on_tokens is not None:
            self._tell(live)

    def _tell(self, live: np.ndarray) -> None:
        """Pass on the tokens made since the last look: ended rows' answers, plus each live row's so far (a
        live row's `produced` is its position past the prompt, plus the first token the prefill chose)."""
        assert self.on_tokens is not None
        running = (self.job >= 0) & live
        made = self.finished + int((self.position[running] - self.prompt_len[running] + 1).sum())
        if made > self.reported:
            self.on_tokens(made - self.reported)
            self.reported = made

    def schedule(self) -> bool:
        """Admit waiting prompts into free slots once enough are free (or none is busy); True when it did."""
        slots, busy, waiting = self.decoder.slots, self.busy, self.waiting
        if not waiting or not (slots - busy >= min(self.refill_at, len(waiting)) or busy == 0):
            return False
        free = np.flatnonzero(self.job < 0)
        chosen = [waiting.popleft() for _ in range(min(len(free), len(waiting)))]
        began = time.perf_counter()
        for group, where in self._prefill_groups(chosen, free):
            prompts = [list(self.prompts[j]) for j in group]
            self.decoder.start_rows(prompts, where.tolist(), [self.key_of[j] for j in group])
            self.job[where] = group
            self.position[where] = [len(p) for p in prompts]
            self.prompt_len[where] = self.position[where]
            self.stats.prefill_tokens += sum(len(p) for p in prompts)
        _sync(self.decoder.device)
        self.stats.prefill_s += time.perf_counter() - began
        return True

    def _prefill_groups(self, chosen: list[int], free: np.ndarray) -> list[tuple[list[int], np.ndarray]]:
        """`chosen` prompts with the free slots they go to, in groups of at most `prefill_tokens` padded tokens."""
        groups, start = [], 0
        while start < len(chosen):
            width, end = 0, start
            while end < len(chosen) and (
                end == start
                or max(width, len(self.prompts[chosen[end]])) * (end - start + 1) <= self.prefill_tokens
            ):
                width = max(width, len(self.prompts[chosen[end]]))
                end += 1
            groups.append((chosen[start:end], free[start:end]))
            start = end
        return groups

    def decode(self) -> None:
        """`sync_every` steps on the device, the host only launching them."""
        decoder, stats, running = self.decoder, self.stats, self.job >= 0
        began = time.perf_counter()
        for _ in range(self.sync_every):
            length = decoder.bucket(int(self.position[running].max()) + decoder.tokens_per_step)
            decoder.step(length)
            self.position[running] += decoder.tokens_per_step
            stats.steps += 1
            stats.slot_steps += decoder.slots
            stats.attended_padded += decoder.slots * length
            stats.lengths.add(length)
        _sync(decoder.device)
        stats.decode_s += time.perf_counter() - began

    def finish(self) -> DecodeStats:
        """The job's figures, once every prompt is answered."""
        stats, decoder = self.stats, self.decoder
        stats.row_steps = int(decoder.live_row_steps)
        stats.attended = int(decoder.attended_positions)
        if decoder.exact_lengths:
            stats.attended_padded = stats.attended  # the kernel reads each row's own positions only
        stats.generated = sum(len(r) for r in self.results)
        stats.graphs = decoder.graphs_captured
        return stats


def auto_slots(model: Any, max_len: int, kv_bytes: int, cap: int, free_bytes: int | None) -> int:
    """Slots that fit 85% of the free memory beside the model (a multiple of 64 from 64 up), at most `cap`."""
    if free_bytes is None:
        return cap
    per_slot = max_len * kv_bytes
    fit = int(free_bytes * 0.85) // max(per_slot, 1)
    if fit >= 64:
        fit = fit // 64 * 64
    return max(1, min(cap, fit))
