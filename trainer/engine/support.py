"""Which targets the KV engine serves (trainer.engine.decoder), read from their config files alone, before any
weight loads: the families whose layer is exactly "norm, attention with RoPE, residual, norm, MLP, residual",
full attention, RoPE that does not change with the length, and no generation setting that would change which
token greedy decoding picks. Anything else keeps transformers' `generate` (`data regenerate`), and `eval` its
Python loop."""

from __future__ import annotations

from typing import Any

SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")
# transformers' generation settings that change which token greedy decoding picks: with any of them set
# to a non-default value, `generate` is the only engine that would honour it.
_LOGITS_SETTINGS = {
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "min_length": 0,
    "min_new_tokens": None,
    "sequence_bias": None,
    "exponential_decay_length_penalty": None,
}


def unsupported_reason(config: Any, generation_config: Any = None) -> str | None:
    """Why this target cannot use the KV decoder (None: it can). Configs only: nothing is loaded."""
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED:
        return f"model type {kind!r} (the KV decoder knows {', '.join(SUPPORTED)})"
    if getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None):
        return "sliding-window attention"
    if kind == "mistral" and getattr(config, "sliding_window", None):
        return "sliding-window attention"
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return "layers other than full attention"
    rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in ("default", "linear", "llama3"):
        return f"RoPE type {rope_type!r} (its frequencies change with the length)"
    for name, default in _LOGITS_SETTINGS.items():
        value = getattr(generation_config, name, default) if generation_config is not None else default
        if value not in (default, None) and value != default:
            return f"generation_config.{name} = {value!r}"
    return None


def kv_engine_reason(target: str) -> str | None:
    """Why `target` cannot use this engine (None: it can), from its config files alone."""
    from transformers import AutoConfig, GenerationConfig

    from trainer.runspec.target_shapes import is_embedded

    if is_embedded(target):
        return "an embedded target"
    config = AutoConfig.from_pretrained(target, local_files_only=True)
    try:
        generation = GenerationConfig.from_pretrained(target, local_files_only=True)
    except OSError:
        generation = None
    return unsupported_reason(config, generation)
