"""transformers' `generate` as a `data regenerate` engine: for the targets the KV engine does not know
(trainer.engine.support), batched on one device, greedy or sampled."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from trainer.engine.target import Chat, load_generation_target, prompt_ids, stop_token_ids
from trainer.regenerate.settings import Completion, GenerationSettings

# Prompt widths are rounded up to this many tokens under a static cache (one compiled shape per bucket).
WIDTH_BUCKET = 256
# Up to this batch size a static cache (compiled decode step) beats eager decoding on an H200.
STATIC_CACHE_MAX_BATCH = 64


class TorchEngine:
    """Batched generation with the target on one device: chats sorted by length (less padding), left-padded,
    KV cache, greedy or sampled (transformers' `generate`)."""

    name = "torch"

    def __init__(self, settings: GenerationSettings, device: str = "cpu", batch_size: int = 8) -> None:
        import torch

        self.settings, self.batch_size = settings, batch_size
        self.device = torch.device(device)
        self.model, self.tokenizer = load_generation_target(settings.target, self.device, settings.dtype)
        self.stop_ids = stop_token_ids(self.tokenizer, self.model.generation_config)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if isinstance(pad, int) else (self.stop_ids[0] if self.stop_ids else 0)
        self.calls = 0
        self.rows_at_once = batch_size if self.device.type == "cuda" else 1
        # On a CPU one batch is the first commit (about a minute at 8 rows, not 64 conversations' ~9 minutes).
        self.first_chunk = batch_size if self.device.type == "cpu" else None
        self.on_tokens: Callable[[int], None] | None = None
        # Small batches on a GPU are bound by Python and kernel launches: a static cache lets `generate` replay
        # one compiled step per token instead (H200, Qwen3-8B shapes: 34 -> 126 tok/s at batch 1, 409 -> 1235 at
        # 16, 1642 -> 2145 at 64). From 128 rows eager decoding is faster (3048 vs 2475 tok/s): the compiled
        # step attends over the whole preallocated cache. bench/decode/regenerate_throughput.py measures both.
        self.static_cache = self.device.type == "cuda" and batch_size <= STATIC_CACHE_MAX_BATCH
        if self.static_cache:
            import torch._dynamo

            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)

    def generate(self, chats: Sequence[Chat], keys: Sequence[int] | None = None) -> list[Completion]:
        if keys is not None and self.settings.temperature > 0:  # engine_factory refuses this up front
            raise ValueError("transformers' generate cannot draw an answer from its own key")
        encoded = [prompt_ids(self.tokenizer, c, self.settings.chat_template_kwargs) for c in chats]
        order = sorted(range(len(chats)), key=lambda i: len(encoded[i]))
        results: dict[int, Completion] = {}
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            for i, completion in zip(batch, self._generate_batch([encoded[i] for i in batch]), strict=True):
                results[i] = completion
        return [results[i] for i in range(len(chats))]

    def _generate_batch(self, prompts: list[list[int]]) -> list[Completion]:
        self.calls += 1
        rows = generate_token_batch(
            self.model,
            prompts,
            self.settings,
            self.pad_id,
            self.stop_ids,
            seed=self.settings.seed + self.calls,
            static_cache=self.static_cache,
            on_tokens=self.on_tokens,
        )
        return [self._completion(row) for row in rows]

    def _completion(self, new_ids: list[int]) -> Completion:
        ended = next((i for i, t in enumerate(new_ids) if t in self.stop_ids), None)
        kept = new_ids if ended is None else new_ids[:ended]
        text = self.tokenizer.decode(kept, skip_special_tokens=True)
        tokens = len(kept) + (0 if ended is None else 1)
        written = tuple(new_ids if ended is None else new_ids[: ended + 1])
        return Completion(text, tokens, "length" if ended is None else "stop", written)

    def close(self) -> None:
        pass


def generate_token_batch(
    model: Any,
    prompts: list[list[int]],
    settings: GenerationSettings,
    pad_id: int,
    stop_ids: list[int],
    seed: int,
    static_cache: bool = False,
    on_tokens: Callable[[int], None] | None = None,
) -> list[list[int]]:
    """New token ids for each prompt (left-padded into one batch; KV cache; greedy when temperature is 0).
    Rows that stop early are padded after their stop token, which the caller cuts at.

    `static_cache`: a preallocated cache, which transformers' `generate` pairs with a compiled decode step
    (CUDA graphs) on a GPU; the padded width is rounded up to a multiple of WIDTH_BUCKET so that a job's
    batches share a few compiled shapes instead of compiling one per batch.

    `on_tokens(n)`: after each decode step, the rows that made a token in it (`TokenCounter`).
    """
    import torch

    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    if static_cache:
        width = -(-width // WIDTH_BUCKET) * WIDTH_BUCKET
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):  # left padding: every row's last prompt token is in the same column
        ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        attention[row, width - len(p) :] = 1
    sample = settings.temperature > 0
    torch.manual_seed(seed)
    extra: dict[str, Any] = {"cache_implementation": "static"} if static_cache else {}
    if on_tokens is not None:
        from transformers import StoppingCriteriaList

        extra["stopping_criteria"] = StoppingCriteriaList([TokenCounter(on_tokens, width, stop_ids, device)])
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=attention.to(device),
            max_new_tokens=settings.max_new_tokens,
            do_sample=sample,
            temperature=settings.temperature if sample else None,
            top_p=settings.top_p if sample else None,
            top_k=None,
            eos_token_id=stop_ids or None,
            pad_token_id=pad_id,
            **extra,
        )
    return [row[width:].tolist() for row in out.cpu()]


class TokenCounter:
    """A stopping criterion that never stops: it tells `on_tokens` how many rows made a token each step.

    On a CPU it reads the step's last column (host memory: free) and stops counting a row after its stop token.
    On a GPU that read would be a host sync per step, so it counts every row until the batch ends: an upper
    bound by the padding after the rows that stopped, corrected when the batch's answers are committed."""

    def __init__(
        self, on_tokens: Callable[[int], None], width: int, stop_ids: list[int], device: Any
    ) -> None:
        self.on_tokens, self.width, self.stops = on_tokens, width, set(stop_ids)
        self.exact = getattr(device, "type", "cpu") == "cpu"
        self.ended: list[bool] = []

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        rows = int(input_ids.shape[0])
        if input_ids.shape[1] > self.width:  # the call after the prefill's first token, and each step's
            if self.exact:
                last = input_ids[:, -1].tolist()
                self.ended = self.ended or [False] * rows
                made = sum(1 for row in range(rows) if not self.ended[row])
                self.ended = [e or t in self.stops for e, t in zip(self.ended, last, strict=True)]
            else:
                made = rows
            if made:
                self.on_tokens(made)
        return torch.zeros(rows, dtype=torch.bool, device=input_ids.device)
