"""Continuous batching over the KV decoder: every slot decodes one answer, and a slot whose answer ended takes
the next prompt, so no batch waits for its longest answer (on the H200, 36% of a SmolLM2 job's answers ran
to the 384-token cap while most rows finished far earlier, idle until the batch ended).

Prompts are taken longest first (refills of similar length pad little), refilled in groups once a sixteenth
of the slots is free (a prefill of a handful of prompts costs most of a step), and each group's prefill is
split to hold at most `prefill_tokens` tokens. A row stops at a stop token or at `max_new_tokens`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from trainer.engine.decoder import KVDecoder

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


def decode_all(
    decoder: KVDecoder,
    prompts: Sequence[list[int]],
    max_new_tokens: int,
    stop_ids: Sequence[int],
    temperature: float = 0.0,
    top_p: float = 1.0,
    keys: Sequence[int] | None = None,
    prefill_tokens: int = PREFILL_TOKENS,
    sync_every: int = SYNC_EVERY,
    on_tokens: Callable[[int], None] | None = None,
) -> tuple[list[list[int]], DecodeStats]:
    """The new token ids of every prompt (its stop token included when it stopped), in input order.

    The device does each step's bookkeeping (KVDecoder._advance); the host looks every `sync_every` steps:
    it collects the answers that ended and refills their slots. A row that ends between looks idles until
    the next one (a few steps of a few hundred), which is what the host's absence from the other steps buys.

    `on_tokens(n)`: the tokens generated since the last call, at each look. Counted from what a look copies
    anyway (live rows' positions, ended rows' answers), so it adds no host sync to the decode loop: a
    progress bar moves every `sync_every` steps instead of when the whole call ends (issue 39 U3)."""
    if any(len(p) + max_new_tokens > decoder.max_len for p in prompts):
        raise ValueError("a prompt and its answer do not fit the decoder's max_len")
    slots, device = decoder.slots, decoder.device
    decoder.configure(max_new_tokens, stop_ids, temperature, top_p)
    stats = DecodeStats()
    queue = deque(sorted(range(len(prompts)), key=lambda i: -len(prompts[i])))
    results: list[list[int]] = [[] for _ in prompts]
    job = np.full(slots, -1, dtype=np.int64)  # the prompt each slot answers (-1: free)
    position = np.zeros(slots, dtype=np.int64)  # an upper bound on each slot's position (the SDPA bucket)
    prompt_len = np.zeros(slots, dtype=np.int64)  # the prompt length of the row each slot answers
    reported = finished = 0  # tokens already passed to on_tokens; tokens of the answers collected
    key_of = list(keys) if keys is not None else [0] * len(prompts)
    refill_at = max(1, slots // 16)

    def collect() -> None:
        """Take the answers of rows that ended since the last look; their slots become free."""
        nonlocal finished
        live = decoder.live.cpu().numpy()
        position[:] = decoder.positions.cpu().numpy()
        ended = np.flatnonzero((job >= 0) & ~live)
        if ended.size:
            where = torch.as_tensor(ended, device=device)
            counts = decoder.produced[where].cpu().tolist()
            answers = decoder.answers[where, : max(counts)].cpu().tolist()
            for row, count, answer in zip(ended.tolist(), counts, answers, strict=True):
                results[job[row]] = answer[:count]
            job[ended] = -1
            finished += sum(counts)
        if on_tokens is not None:
            tell(live)

    def tell(live: np.ndarray) -> None:
        """Pass on the tokens made since the last look: ended rows' answers, plus each live row's so far (a
        live row's `produced` is its position past the prompt, plus the first token the prefill chose)."""
        nonlocal reported
        assert on_tokens is not None
        running = (job >= 0) & live
        made = finished + int((position[running] - prompt_len[running] + 1).sum())
        if made > reported:
            on_tokens(made - reported)
            reported = made

    def refill() -> None:
        free = np.flatnonzero(job < 0)
        take = min(len(free), len(queue))
        chosen = [queue.popleft() for _ in range(take)]
        start = 0
        began = time.perf_counter()
        while start < take:  # prefill groups of at most `prefill_tokens` tokens
            width, end = 0, start
            while end < take and (
                end == start or max(width, len(prompts[chosen[end]])) * (end - start + 1) <= prefill_tokens
            ):
                width = max(width, len(prompts[chosen[end]]))
                end += 1
            group, where = chosen[start:end], free[start:end]
            decoder.start_rows([list(prompts[j]) for j in group], where.tolist(), [key_of[j] for j in group])
            job[where] = group
            position[where] = [len(prompts[j]) for j in group]
            prompt_len[where] = position[where]
            stats.prefill_tokens += sum(len(prompts[j]) for j in group)
            start = end
        _sync(device)
        stats.prefill_s += time.perf_counter() - began

    while True:
        collect()
        busy = int((job >= 0).sum())
        if queue and (slots - busy >= min(refill_at, len(queue)) or busy == 0):
            refill()
            continue  # a row can end at its first token: look again before decoding
        if busy == 0:
            break
        began = time.perf_counter()
        for _ in range(sync_every):
            length = decoder.bucket(int(position[job >= 0].max()) + 1)
            decoder.step(length)
            position[job >= 0] += 1
            stats.steps += 1
            stats.slot_steps += slots
            stats.attended_padded += slots * length
            stats.lengths.add(length)
        _sync(device)
        stats.decode_s += time.perf_counter() - began
    stats.row_steps = int(decoder.live_row_steps)
    stats.attended = int(decoder.attended_positions)
    if decoder.exact_lengths:
        stats.attended_padded = stats.attended  # the kernel reads each row's own positions only
    stats.generated = sum(len(r) for r in results)
    stats.graphs = decoder.graphs_captured
    return results, stats


def auto_slots(model: Any, max_len: int, kv_bytes: int, cap: int, free_bytes: int | None) -> int:
    """Slots that fit 85% of the free memory beside the model (a multiple of 64 from 64 up), at most `cap`."""
    if free_bytes is None:
        return cap
    per_slot = max_len * kv_bytes
    fit = int(free_bytes * 0.85) // max(per_slot, 1)
    if fit >= 64:
        fit = fit // 64 * 64
    return max(1, min(cap, fit))
