"""The target as the engine serves it: loaded with its tokenizer in training's dtype policy, a chat rendered
into prompt ids by the target's own template, and the ids where an answer stops. `data regenerate` and `eval`
read prompts and stops through here, so both decode the same prompts the same way."""

from __future__ import annotations

from typing import Any

Chat = list[dict[str, str]]


def prompt_ids(tokenizer: Any, chat: Chat, template_kwargs: dict[str, Any]) -> list[int]:
    """The chat rendered by the target's own template, ending in the assistant's header."""
    out = tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=True, **template_kwargs)
    if hasattr(out, "keys"):  # newer transformers return a BatchEncoding
        out = out["input_ids"]
    return list(out)


def stop_token_ids(tokenizer: Any, model_config: Any) -> list[int]:
    """Where an answer ends: the model's generation config's eos ids, else the tokenizer's eos token."""
    ids: list[int] = []
    generation_config = getattr(model_config, "eos_token_id", None)
    for value in (generation_config, getattr(tokenizer, "eos_token_id", None)):
        if isinstance(value, int):
            ids.append(value)
        elif isinstance(value, list | tuple):
            ids += [v for v in value if isinstance(v, int)]
    return sorted(set(ids))


def load_generation_target(path: str, device: Any, dtype: str = "auto") -> tuple[Any, Any]:
    """(causal LM with its head, tokenizer) from a local folder, in the dtype policy training uses
    (`target.dtype`; auto: bf16 on CUDA, fp32 on CPU)."""
    from dflash_base.errors import ConfigError
    from trainer.model.device import target_dtype
    from trainer.runspec.target_shapes import is_embedded
    from trainer.target_model.load import load_target_model
    from trainer.target_model.tokenizer import load_tokenizer

    if is_embedded(path):
        raise ConfigError(
            f'target.path: "{path}" has no tokenizer or chat template; regeneration needs a target folder'
        )
    tokenizer = load_tokenizer(path)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError(f"target.path: {path}: the tokenizer has no chat template")
    model = load_target_model(path, 0, device, target_dtype(dtype, device))
    return model.eval(), tokenizer
