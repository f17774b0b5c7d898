"""A real Hugging Face target folder made offline: the embedded tiny Qwen3 with a 512-word tokenizer and a chat
template, so code that loads `AutoModelForCausalLM`/`AutoTokenizer` from `target.path` runs in tests and in the
benchmarks' `--tiny` dry runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SPECIALS = ["<pad>", "<|im_start|>", "<|im_end|>"]
ROLES = ["system", "user", "assistant", "tool"]
# Qwen3-like in the ways that matter here: role headers, an end-of-turn token, a generation prompt.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def make_tokenizer(vocab_size: int = 512) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = SPECIALS + ROLES
    words += [f"w{i}" for i in range(vocab_size - len(words))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_target_folder(folder: Path, seed: int = 0) -> Path:
    """Save the tiny target (seeded weights) and the tokenizer into `folder`; returns it."""
    import torch

    from trainer.target_model.tiny import build_embedded_target

    model = build_embedded_target("tiny", seed, torch.device("cpu"))
    tokenizer = make_tokenizer(model.config.vocab_size)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.config.eos_token_id = eos
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
