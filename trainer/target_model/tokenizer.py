"""The target folder's tokenizer, one loader for every job (training data, preview, regeneration, eval):
local files only, and an unreadable folder named as `target.path`'s problem (exit 2), not a traceback."""

from __future__ import annotations

from typing import Any

from dflash_base.errors import ConfigError


def load_tokenizer(target_path: str) -> Any:  # a transformers tokenizer
    """The target folder's tokenizer, offline."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(target_path, local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError or its own errors here
        raise ConfigError(f"target.path: cannot load the tokenizer of {target_path}: {exc}") from exc
