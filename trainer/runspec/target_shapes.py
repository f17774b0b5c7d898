"""What the target looks like, without loading it: its transformers config and the layers a drafter captures.

The launch gate (`dflash-doctor train`) and `trainer.runspec.config.load_config` need only shapes. Importing this
module costs nothing beyond the standard library: transformers (and through it torch) is imported only when
a config is actually built, and never the trainer's model code (`trainer.target_model.capture`, `trainer.model.drafter`), whose
imports pull in torch._dynamo, Inductor and flex attention (seconds on a CPU box, more on the H200).

Embedded targets need no download: `target.path = "tiny"` (the default for CPU runs and tests) and
`"random:<preset>"` (e.g. `random:qwen3-8b`, Qwen3-8B's shapes with random weights; trainer/target_model/tiny.py builds
their weights).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_base.errors import ConfigError

if TYPE_CHECKING:
    from transformers import Qwen3Config

TINY = "tiny"
RANDOM_PREFIX = "random:"


# The embedded targets' shapes, one source for both readers below (TargetShapes without transformers, and
# the Qwen3Config the trainer builds its model from).
TINY_FIELDS: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
}
QWEN3_8B_FIELDS: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
}
EMBEDDED_MODEL_TYPE = "qwen3"


def tiny_qwen3_config() -> Qwen3Config:
    """hidden 128, 4 layers, 4 heads, 2 KV heads, head_dim 32, vocab 512 (mask token = 511)."""
    from transformers import Qwen3Config

    return Qwen3Config(**TINY_FIELDS)


def qwen3_8b_config() -> Qwen3Config:
    """The shapes of Qwen3-8B (36 layers, hidden 4096, 32 heads, 8 KV heads, vocab 151936)."""
    from transformers import Qwen3Config

    return Qwen3Config(**QWEN3_8B_FIELDS)


PRESETS: dict[str, Callable[[], Qwen3Config]] = {"qwen3-8b": qwen3_8b_config}
_EMBEDDED_FIELDS = {TINY: TINY_FIELDS, RANDOM_PREFIX + "qwen3-8b": QWEN3_8B_FIELDS}  # by target.path


def is_embedded(path: str) -> bool:
    """True for the targets built in-process (no folder on disk)."""
    return path == TINY or path.startswith(RANDOM_PREFIX)


def embedded_config(path: str) -> Qwen3Config:
    """The transformers config of an embedded target ("tiny" or "random:<preset>"); ConfigError if unknown."""
    from transformers import Qwen3Config

    return Qwen3Config(**_embedded_fields(path))


def _embedded_fields(path: str) -> dict[str, Any]:
    """An embedded target's fields, or the ConfigError naming the known ones."""
    if path not in _EMBEDDED_FIELDS:
        known = ", ".join(f'"{name}"' for name in _EMBEDDED_FIELDS)
        raise ConfigError(f'target.path: unknown embedded target "{path}" (known: {known})')
    return _EMBEDDED_FIELDS[path]


def _config_json(path: str) -> Path:
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise ConfigError(
            f'target.path: "{path}" is not a Hugging Face model folder (no config.json); '
            'use a local folder, "tiny" or "random:qwen3-8b"'
        )
    return folder / "config.json"


def target_hf_config(path: str) -> Any:
    """The transformers config of `target.path`, read without loading weights (no network)."""
    if is_embedded(path):
        return embedded_config(path)
    from transformers import AutoConfig

    config_json = _config_json(path)
    try:
        return AutoConfig.from_pretrained(config_json.parent, local_files_only=True)
    except Exception as exc:  # transformers' and huggingface_hub's errors share no base class but Exception
        raise ConfigError(
            f"target.path: transformers cannot read {config_json}: {type(exc).__name__}: {exc}".strip()
        ) from exc


@dataclass(frozen=True)
class TargetShapes:
    """What the launcher needs to know of a target: its shapes, and nothing that needs transformers.

    Importing transformers costs 13-14 s per process on the H200 machine (1.8 s here), before torchrun even
    starts. An embedded target's shapes are known here; a folder's come from its config.json when that
    states every field (Hugging Face Qwen3 checkpoints do). Otherwise transformers fills in the defaults
    of the model's config class, which only it knows (e.g. `tie_word_embeddings` is True by default for
    most classes, False for Qwen3): then we ask it.
    """

    model_type: str
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool

    @classmethod
    def from_fields(cls, fields_: dict[str, Any]) -> TargetShapes | None:
        """From a config.json's top level; None when a field is missing or not of its type."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = fields_.get(f.name)
            kind = {"str": str, "bool": bool}.get(str(f.type), int)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                return None
            values[f.name] = value
        return cls(**values)

    @classmethod
    def from_config(cls, config: Any) -> TargetShapes:
        """From a transformers config (its class supplies the defaults config.json left out)."""
        heads = int(config.num_attention_heads)
        return cls(
            model_type=str(getattr(config, "model_type", "")),
            num_hidden_layers=int(config.num_hidden_layers),
            hidden_size=int(config.hidden_size),
            intermediate_size=int(config.intermediate_size),
            num_attention_heads=heads,
            num_key_value_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads),
            vocab_size=int(config.vocab_size),
            max_position_embeddings=int(getattr(config, "max_position_embeddings", 1 << 30)),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        )


def target_shapes(path: str) -> TargetShapes:
    """`target.path`'s shapes, without importing transformers when they can be read directly."""
    if is_embedded(path):
        shapes = TargetShapes.from_fields({"model_type": EMBEDDED_MODEL_TYPE, **_embedded_fields(path)})
        assert shapes is not None  # the embedded fields are complete
        return shapes
    config_json = _config_json(path)
    try:
        data = json.loads(config_json.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"target.path: cannot read {config_json}: {exc}") from exc
    shapes = TargetShapes.from_fields(data) if isinstance(data, dict) else None
    return shapes if shapes is not None else TargetShapes.from_config(target_hf_config(path))


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Target layers to capture, evenly spaced from 1 to L-3 (the published DFlash spacing).

    Qwen3-8B (36 layers), 5 draft layers -> [1, 9, 17, 25, 33]. One draft layer -> the middle layer.
    Layer i's output is Hugging Face `hidden_states[i + 1]`.
    """
    if num_target_layers < 1 or num_draft_layers < 1:
        raise ValueError("num_target_layers and num_draft_layers must be >= 1")
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, max(1, num_target_layers - 3)
    span = end - start
    ids = [round(start + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]
    return [min(max(i, 0), num_target_layers - 1) for i in ids]
