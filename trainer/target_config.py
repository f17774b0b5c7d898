"""What the target looks like, without loading it: its transformers config and the layers a drafter captures.

The launch gate (`dflash-doctor train`) and `trainer.config.load_config` need only shapes. Importing this
module costs nothing beyond the standard library: transformers (and through it torch) is imported only when
a config is actually built, and never the trainer's model code (`trainer.target`, `trainer.drafter`), whose
imports pull in torch._dynamo, Inductor and flex attention (seconds on a CPU box, more on the H200).

Embedded targets need no download: `target.path = "tiny"` (the default for CPU runs and tests) and
`"random:<preset>"` (e.g. `random:qwen3-8b`, Qwen3-8B's shapes with random weights; trainer/tiny.py builds
their weights).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_doctor.errors import ConfigError

if TYPE_CHECKING:
    from transformers import Qwen3Config

TINY = "tiny"
RANDOM_PREFIX = "random:"


def tiny_qwen3_config() -> Qwen3Config:
    """hidden 128, 4 layers, 4 heads, 2 KV heads, head_dim 32, vocab 512 (mask token = 511)."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        initializer_range=0.02,
    )


def qwen3_8b_config() -> Qwen3Config:
    """The shapes of Qwen3-8B (36 layers, hidden 4096, 32 heads, 8 KV heads, vocab 151936)."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
    )


PRESETS: dict[str, Callable[[], Qwen3Config]] = {"qwen3-8b": qwen3_8b_config}


def is_embedded(path: str) -> bool:
    """True for the targets built in-process (no folder on disk)."""
    return path == TINY or path.startswith(RANDOM_PREFIX)


def embedded_config(path: str) -> Qwen3Config:
    """The transformers config of an embedded target ("tiny" or "random:<preset>"); KeyError if unknown."""
    if path == TINY:
        return tiny_qwen3_config()
    name = path.removeprefix(RANDOM_PREFIX)
    if name not in PRESETS:
        raise KeyError(name)
    return PRESETS[name]()


def target_hf_config(path: str) -> Any:
    """The transformers config of `target.path`, read without loading weights (no network)."""
    if is_embedded(path):
        try:
            return embedded_config(path)
        except KeyError:
            known = ", ".join(f'"{name}"' for name in (TINY, *(RANDOM_PREFIX + p for p in PRESETS)))
            raise ConfigError(f'target.path: unknown embedded target "{path}" (known: {known})') from None
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise ConfigError(
            f'target.path: "{path}" is not a Hugging Face model folder (no config.json); '
            'use a local folder, "tiny" or "random:qwen3-8b"'
        )
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder, local_files_only=True)


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
