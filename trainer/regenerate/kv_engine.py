"""`data regenerate`'s fast torch engine: the KV decoder with continuous batching (trainer.engine.scheduler),
for the targets it supports; the others keep `TorchEngine` (transformers' `generate`).

Greedy answers are the same tokens `TorchEngine` writes (fp32 on a CPU: bitwise; bf16 on a GPU: the same up
to near-ties, which `eval` classifies). Sampled answers are drawn with per-answer keys
(trainer.engine.sampling), so they do not depend on the batch they were decoded in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from trainer.engine.decoder import KVDecoder, kv_bytes_per_token
from trainer.engine.roofline import decode_roofline, peaks_of
from trainer.engine.scheduler import DecodeStats, Scheduler, auto_slots
from trainer.engine.target import Chat, load_generation_target, prompt_ids, stop_token_ids
from trainer.regenerate.settings import Completion, GenerationSettings

MAX_SLOTS = 2048  # rows decoded at once by default on a GPU (a 135M target's step still gains at 2,048)
CONTEXT_ROUND = (
    512  # the cache's length is rounded up to this, so a job's calls share one cache and its graphs
)


class KVEngine:
    """Answers chats with continuous batching over a preallocated KV cache (CUDA graphs on a GPU)."""

    name = "torch"

    def __init__(self, settings: GenerationSettings, device: str = "cpu", slots: int | None = None) -> None:
        self.settings = settings
        self.device = torch.device(device)
        self.model, self.tokenizer = load_generation_target(settings.target, self.device, settings.dtype)
        self.stop_ids = stop_token_ids(self.tokenizer, self.model.generation_config)
        self.requested_slots = slots or (MAX_SLOTS if self.device.type == "cuda" else 8)
        self.decoder: KVDecoder | None = None
        self.stats = DecodeStats()
        self.rows_at_once = 1  # time follows the rows: a commit's chunk is not held to whole batches
        # ... but a commit of fewer conversations than a few times the slots is mostly its own tail (the last
        # rows decoding alone): on a GPU the first commit fills the slots four times over. On a CPU it is one
        # fill of the slots: 8 answers at SmolLM2-135M's ~60 tok/s on a 2-core box are about a minute, where
        # 64 conversations were ~9 minutes a Ctrl-C could lose (issue 39 U3); the pace takes over from there.
        self.first_chunk = self.requested_slots * (4 if self.device.type == "cuda" else 1)
        self.on_tokens: Callable[[int], None] | None = None  # told the tokens made, every SYNC_EVERY steps

    def _decoder_for(self, longest_prompt: int) -> KVDecoder:
        """The decoder, made (again) when a prompt and its answer would not fit the cache."""
        need = longest_prompt + self.settings.max_new_tokens
        if self.decoder is not None and need <= self.decoder.max_len:
            return self.decoder
        context = int(getattr(self.model.config, "max_position_embeddings", need) or need)
        max_len = min(max(need, -(-need // CONTEXT_ROUND) * CONTEXT_ROUND), max(context, need))
        self.decoder = None  # free the old cache before the new one is allocated
        free = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            free = torch.cuda.mem_get_info(self.device)[0]
        kv = kv_bytes_per_token(self.model.config, next(self.model.parameters()).dtype)
        slots = auto_slots(self.model, max_len, kv, self.requested_slots, free)
        self.decoder = KVDecoder(self.model, slots, max_len)
        return self.decoder

    def generate(self, chats: Sequence[Chat], keys: Sequence[int] | None = None) -> list[Completion]:
        encoded = [prompt_ids(self.tokenizer, c, self.settings.chat_template_kwargs) for c in chats]
        decoder = self._decoder_for(max(len(p) for p in encoded))
        rows, stats = Scheduler(
            decoder,
            encoded,
            self.settings.max_new_tokens,
            self.stop_ids,
            self.settings.temperature,
            self.settings.top_p,
            keys,
            on_tokens=self.on_tokens,
        ).run()
        self.stats.add(stats)
        return [self._completion(r) for r in rows]

    def _completion(self, new_ids: list[int]) -> Completion:
        ended = next((i for i, t in enumerate(new_ids) if t in self.stop_ids), None)
        kept = new_ids if ended is None else new_ids[:ended]
        text = self.tokenizer.decode(kept, skip_special_tokens=True)
        written = tuple(new_ids if ended is None else new_ids[: ended + 1])
        return Completion(text, len(new_ids), "length" if ended is None else "stop", written)

    def report(self) -> dict[str, Any]:
        """The decode's own figures (for --json and the bench)."""
        s = self.stats
        return {
            "slots": self.decoder.slots if self.decoder else 0,
            "decode_steps": s.steps,
            "live_share": round(s.row_steps / s.slot_steps, 4) if s.slot_steps else 0.0,
            "mean_attended": round(s.attended / s.row_steps, 1) if s.row_steps else 0.0,
            "attended_padded_share": round(s.attended / s.attended_padded, 4) if s.attended_padded else 0.0,
            "prefill_tokens": s.prefill_tokens,
            "prefill_s": round(s.prefill_s, 3),
            "decode_s": round(s.decode_s, 3),
            "generated_tokens": s.generated,
            "graphs": s.graphs,
            "roofline": self.roofline(
                torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else ""
            ),
        }

    def roofline(self, device_name: str) -> dict[str, Any] | None:
        """The decode's rate beside what its bytes and FLOPs allow at this GPU's peaks (issue 36: the rate in
        --json beside its roofline); None where the peaks are unknown (a CPU, a GPU not in the table)."""
        peaks = peaks_of(device_name) if device_name else None
        if peaks is None or not self.stats.steps:
            return None
        kv = kv_bytes_per_token(self.model.config, next(self.model.parameters()).dtype)
        return decode_roofline(self.model, self.stats, kv, peaks).to_json()

    def close(self) -> None:
        self.decoder = None
