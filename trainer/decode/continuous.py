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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from trainer.decode.kv_decoder import KVDecoder
from trainer.decode.sampling import choose_tokens

PREFILL_TOKENS = 32768  # tokens in one prefill forward: its activations stay a small share of memory


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
) -> tuple[list[list[int]], DecodeStats]:
    """The new token ids of every prompt (its stop token included when it stopped), in input order."""
    if any(len(p) + max_new_tokens > decoder.max_len for p in prompts):
        raise ValueError("a prompt and its answer do not fit the decoder's max_len")
    slots, device = decoder.slots, decoder.device
    stats = DecodeStats()
    queue = deque(sorted(range(len(prompts)), key=lambda i: -len(prompts[i])))
    results: list[list[int]] = [[] for _ in prompts]
    job = np.full(slots, -1, dtype=np.int64)  # the prompt each slot answers (-1: idle)
    position = np.zeros(slots, dtype=np.int64)  # where each slot's next fed token goes
    produced = np.zeros(slots, dtype=np.int64)
    stops = np.array(sorted(set(stop_ids)), dtype=np.int64)
    key_of = np.array(list(keys) if keys is not None else [0] * len(prompts), dtype=np.int64)
    slot_keys = torch.zeros(slots, dtype=torch.long, device=device)
    refill_at = max(1, slots // 16)

    def finish_tokens(rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Record each row's new token; the rows whose answer ended."""
        for row, token in zip(rows.tolist(), tokens.tolist(), strict=True):
            results[job[row]].append(token)
        produced[rows] += 1
        return rows[np.isin(tokens, stops) | (produced[rows] >= max_new_tokens)]

    def refill() -> None:
        free = np.flatnonzero(job < 0)
        take = min(len(free), len(queue))
        chosen = [queue.popleft() for _ in range(take)]
        start = 0
        while start < take:  # prefill groups of at most `prefill_tokens` tokens
            width, end = 0, start
            while end < take and (
                end == start or max(width, len(prompts[chosen[end]])) * (end - start + 1) <= prefill_tokens
            ):
                width = max(width, len(prompts[chosen[end]]))
                end += 1
            group, where = chosen[start:end], free[start:end]
            began = time.perf_counter()
            logits = decoder.prefill([list(prompts[j]) for j in group], where.tolist())
            job[where] = group
            position[where] = [len(prompts[j]) for j in group]
            produced[where] = 0
            where_t = torch.as_tensor(where, device=device)
            slot_keys[where_t] = torch.as_tensor(key_of[group], device=device)
            first = choose_tokens(logits, temperature, top_p, slot_keys[where_t], torch.zeros_like(where_t))
            decoder.tokens[where_t] = first
            ended = finish_tokens(where, first.cpu().numpy())
            job[ended] = -1
            _sync(device)
            stats.prefill_s += time.perf_counter() - began
            stats.prefill_tokens += sum(len(prompts[j]) for j in group)
            start = end

    while queue or (job >= 0).any():
        live = job >= 0
        if queue and (slots - live.sum() >= min(refill_at, len(queue)) or not live.any()):
            refill()
            live = job >= 0
            if not live.any():
                continue
        began = time.perf_counter()
        position[~live] = 0  # idle slots compute at position 0, which a prefill writes before it is read
        longest = int(position[live].max()) + 1
        length = decoder.bucket(longest)
        decoder.positions.copy_(torch.from_numpy(position))
        logits = decoder.step(length)
        steps = torch.from_numpy(produced).to(device)
        tokens = choose_tokens(logits, temperature, top_p, slot_keys, steps)
        decoder.tokens.copy_(tokens)
        rows = np.flatnonzero(live)
        ended = finish_tokens(rows, tokens.cpu().numpy()[rows])
        job[ended] = -1
        position[rows] += 1
        stats.steps += 1
        stats.row_steps += len(rows)
        stats.slot_steps += slots
        stats.attended += int(position[rows].sum())
        stats.attended_padded += slots * length
        stats.lengths.add(length)
        stats.decode_s += time.perf_counter() - began
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
