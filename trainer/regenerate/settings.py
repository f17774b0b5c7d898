"""What `data regenerate` asks of an engine, whichever answers: the settings that decide the answers (recorded
in every output line), a completion, and the protocol every engine (`generate`, the KV engine, a device pool,
vLLM) follows, so the file they feed is the same whichever ran."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from trainer.engine.target import Chat
from trainer.runspec.regenerate_request import DEFAULTS


@dataclass(frozen=True)
class GenerationSettings:
    """What decides the answers: recorded in every output line, compared on resume. The run config gives the
    target, its dtype and chat template; the request (`prepare_regeneration`) the rest, its defaults here too."""

    target: str
    max_new_tokens: int = DEFAULTS.max_new_tokens
    temperature: float = DEFAULTS.temperature  # 0: greedy
    top_p: float = DEFAULTS.top_p
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    seed: int = DEFAULTS.seed
    dtype: str = "auto"  # target.dtype: auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp16 | fp32

    def to_json(self) -> dict[str, Any]:
        """`dtype` is written only when not auto, so that outputs written before it was recorded resume."""
        return {
            "target": self.target,
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "chat_template_kwargs": dict(self.chat_template_kwargs),
            "seed": self.seed,
        } | ({"dtype": self.dtype} if self.dtype != "auto" else {})


@dataclass(frozen=True)
class Completion:
    text: str
    tokens: int  # generated tokens, the end-of-turn token included when there was one
    finish_reason: str  # "stop" (the model ended its turn) or "length" (max_new_tokens reached)
    # the ids the engine wrote, up to its end-of-turn token: for comparing engines token by token (the text alone
    # can tokenise back differently); not part of equality, which stays the answer's text and ending
    token_ids: tuple[int, ...] = field(default=(), compare=False)


class Engine(Protocol):
    name: str
    # Rows decoded at once on a GPU, where a batch costs about the same however full it is (the commit pace
    # counts whole batches there); 1 where time follows the rows (a CPU) or is unknown (vLLM schedules its own)
    rows_at_once: int

    # keys: one per chat when sampling (trainer.engine.sampling.row_key); greedy engines may ignore them
    def generate(self, chats: Sequence[Chat], keys: Sequence[int] | None = None) -> list[Completion]: ...

    def close(self) -> None: ...


@runtime_checkable
class CountsTokens(Protocol):
    """An engine that counts its tokens as it makes them: `on_tokens` (None until the caller sets it) is told
    the tokens made since its last call, so progress moves while a call runs (the KV engine every SYNC_EVERY
    steps, `generate` every step, a device pool every TOKENS_EVERY_S); vLLM's engine has none."""

    on_tokens: Callable[[int], None] | None
