"""vLLM's offline `LLM.chat` as a `data regenerate` engine, where vLLM is installed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainer.engine.target import Chat
from trainer.regenerate.settings import Completion, GenerationSettings


class VllmEngine:
    """vLLM's offline `LLM.chat`: the engine most people already regenerate with (tensor parallel as asked)."""

    name = "vllm"

    def __init__(self, settings: GenerationSettings, tensor_parallel_size: int = 1) -> None:
        import vllm

        self.settings = settings
        self.sampling = vllm.SamplingParams(
            temperature=settings.temperature,
            top_p=settings.top_p,
            max_tokens=settings.max_new_tokens,
            seed=settings.seed,
        )
        self.llm = vllm.LLM(model=settings.target, tensor_parallel_size=tensor_parallel_size)
        self.rows_at_once = 1  # vLLM batches continuously, up to limits of its own: the pace counts rows

    def generate(self, chats: Sequence[Chat], keys: Sequence[int] | None = None) -> list[Completion]:
        sampling: Any = self.sampling
        if keys is not None and self.settings.temperature > 0:  # vLLM's per-request seed: each answer's key
            sampling = [self._seeded(key) for key in keys]
        outputs = self.llm.chat(
            list(chats),
            sampling_params=sampling,
            chat_template_kwargs=dict(self.settings.chat_template_kwargs),
            use_tqdm=False,
        )
        completions = []
        for request in outputs:
            best = request.outputs[0]
            reason = "stop" if best.finish_reason == "stop" else "length"
            completions.append(Completion(best.text, len(best.token_ids), reason, tuple(best.token_ids)))
        return completions

    def _seeded(self, key: int) -> Any:
        import vllm

        s = self.settings
        return vllm.SamplingParams(
            temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_new_tokens, seed=key
        )

    def close(self) -> None:
        pass


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None
