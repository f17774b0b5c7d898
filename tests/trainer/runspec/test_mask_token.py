"""The mask token: resolved by the rules in order, each rule tested where it chooses and where it passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_base.errors import ConfigError
from trainer.runspec.config import load_config
from trainer.runspec.mask_token import (
    RULE_CONFIG,
    RULE_SPARE_SPECIAL,
    RULE_TINY,
    RULE_TOKENIZER,
    RULE_UNUSED,
    resolve_mask_token,
)


def _tokenizer_folder(
    tmp_path: Path,
    vocab_words: int,
    added: list[tuple[int, str, bool]],
    mask: str | None = None,
    settings: dict[str, object] | None = None,
) -> Path:
    vocab = {f"w{i}": i for i in range(vocab_words)}
    added_tokens = [{"id": i, "content": c, "special": s} for i, c, s in added]
    (tmp_path / "tokenizer.json").write_text(
        json.dumps({"model": {"vocab": vocab}, "added_tokens": added_tokens})
    )
    config = ({"mask_token": mask} if mask else {}) | (settings or {})
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def test_the_config_wins_and_its_string_is_read(tmp_path: Path) -> None:
    folder = _tokenizer_folder(tmp_path, 10, [(10, "<|m|>", True)], mask="<|m|>")
    got = resolve_mask_token(str(folder), "qwen3", 20, 3, embedded=False)
    assert (got.id, got.text, got.rule) == (3, "w3", RULE_CONFIG)
    with pytest.raises(ConfigError, match="must be < the target's vocab size 20, got 20"):
        resolve_mask_token(str(folder), "qwen3", 20, 20, embedded=False)


def test_the_tokenizers_own_mask_token_comes_next(tmp_path: Path) -> None:
    folder = _tokenizer_folder(tmp_path, 10, [(10, "<|m|>", True)], mask="<|m|>")
    got = resolve_mask_token(str(folder), "llama", 20, None, embedded=False)
    assert (got.id, got.text, got.rule) == (10, "<|m|>", RULE_TOKENIZER)


def test_published_qwen3_value_when_it_is_not_an_ordinary_token(tmp_path: Path) -> None:
    folder = _tokenizer_folder(tmp_path, 10, [])
    got = resolve_mask_token(str(folder), "qwen3", 151936, None, embedded=False)
    assert (got.id, got.rule) == (151669, "the published value for Qwen3")
    # random:qwen3-8b has no tokenizer: the published value, checked against the vocabulary size only
    assert load_config("qwen3-8b-b16").drafter.mask_token_rule == "the published value for Qwen3"


def test_qwen35_gets_248070_and_151669_is_refused_where_it_is_an_ordinary_token(tmp_path: Path) -> None:
    folder = _tokenizer_folder(tmp_path, 151700, [])  # 151669 is an ordinary word here
    got = resolve_mask_token(str(folder), "qwen3_5", 248320, None, embedded=False)
    assert (got.id, got.rule) == (248070, "the published value for Qwen3.5/3.6")
    # a qwen3 model type whose tokenizer uses 151669 for text: the published value does not fit
    got = resolve_mask_token(str(folder), "qwen3", 151936, None, embedded=False)
    assert (got.id, got.text, got.rule) == (151700, None, RULE_UNUSED)


def test_first_unused_row_then_a_clear_refusal(tmp_path: Path) -> None:
    folder = _tokenizer_folder(tmp_path, 10, [(10, "<s>", True)], settings={"bos_token": "<s>"})
    got = resolve_mask_token(str(folder), "llama", 16, None, embedded=False)
    assert (got.id, got.rule) == (11, RULE_UNUSED)
    with pytest.raises(ConfigError, match="no default for this target") as err:
        resolve_mask_token(str(folder), "llama", 11, None, embedded=False)
    assert "set drafter.mask_token_id" in (err.value.hint or "")


def test_tiny_uses_its_last_id_and_the_config_records_the_rule() -> None:
    cfg = load_config("tiny-cpu")
    assert (cfg.drafter.mask_token_id, cfg.drafter.mask_token_rule) == (511, RULE_TINY)


CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_every_row_a_token_takes_the_first_special_token_chat_never_writes(tmp_path: Path) -> None:
    """SmolLM2's case (Llama, 49,152 rows, all of them tokens, no mask token): ids 0-2 are the unk/bos/eos
    and ChatML's markers, 3.. are code-data markers (<repo_name>, ...) that a chat never contains."""
    added = [(0, "<|endoftext|>", True), (1, "<|im_start|>", True), (2, "<|im_end|>", True)]
    added += [(3, "<repo_name>", True), (4, "<file_sep>", True)]
    settings = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>"}
    folder = _tokenizer_folder(tmp_path, 0, added, settings=settings)
    (folder / "chat_template.jinja").write_text(CHATML)  # where transformers 5 saves the template
    got = resolve_mask_token(str(folder), "llama", 5, None, embedded=False)
    assert (got.id, got.text, got.rule) == (3, "<repo_name>", RULE_SPARE_SPECIAL)


def test_a_special_token_the_template_writes_or_that_is_bos_eos_is_never_the_mask(tmp_path: Path) -> None:
    added = [(0, "<|im_start|>", True), (1, "<|im_end|>", True), (2, "<pad>", True), (3, "<tool>", True)]
    template = CHATML + "{% if tools %}<tool>{% endif %}"
    settings = {"eos_token": {"content": "<|im_end|>"}, "pad_token": "<pad>", "chat_template": template}
    folder = _tokenizer_folder(tmp_path, 0, added, settings=settings)
    with pytest.raises(ConfigError, match="no default for this target"):
        resolve_mask_token(str(folder), "llama", 4, None, embedded=False)
    # an ordinary (non-special) token is never taken by this rule either
    folder = _tokenizer_folder(tmp_path, 0, [*added, (4, "word", False)], settings=settings)
    with pytest.raises(ConfigError, match="no default for this target"):
        resolve_mask_token(str(folder), "llama", 5, None, embedded=False)
