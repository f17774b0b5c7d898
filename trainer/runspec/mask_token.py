"""Which token id the drafter's block slots hold: resolved by rules in a fixed order, and the rule is told.

1. `drafter.mask_token_id`, when the config sets it;
2. the tokenizer's own mask token (`mask_token` in tokenizer_config.json);
3. the published DFlash value for the target's family (Qwen3 151669, Qwen3.5/3.6 248070), when it fits the
   target's embedding and is not an ordinary token of its tokenizer (151669 is one in Qwen3.5's);
4. the first embedding row no tokenizer token uses (Qwen3: 151669 too; it is how the published value arose);
5. the first special token that the chat template never writes and that is not the bos, eos, pad, unk, sep
   or cls token: a target whose every row is a token (SmolLM2: 49,152 rows, 49,152 tokens) still has
   specials no chat holds (SmolLM2's `<repo_name>`, id 3, a marker of its code pre-training data);
6. else a ConfigError saying how to set it.

The embedded targets have no tokenizer: tiny uses its last id, `random:` presets their family's value.
Only the tokenizer's files are read (tokenizer.json, tokenizer_config.json, special_tokens_map.json, the chat
template's own files), never transformers: the launch gate runs this.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_base.errors import ConfigError
from trainer.runspec.target_shapes import TINY

if TYPE_CHECKING:  # types only: config imports this module
    from trainer.runspec.config import TrainConfig

# (model_type prefix, id, family): the ids the published DFlash drafters use; the longer prefix first.
PUBLISHED_MASK_IDS = (("qwen3_5", 248070, "Qwen3.5/3.6"), ("qwen3", 151669, "Qwen3"))

RULE_CONFIG = "drafter.mask_token_id"
RULE_TOKENIZER = "the tokenizer's mask token"
RULE_PUBLISHED = "the published value for {family}"
RULE_UNUSED = "the first embedding row no tokenizer token uses"
RULE_SPARE_SPECIAL = "the first special token that neither the chat template nor bos/eos/pad/unk uses"
RULE_TINY = "the embedded tiny target's last id (it has no tokenizer)"


@dataclass(frozen=True)
class MaskToken:
    id: int
    text: str | None  # the token's string, None for a row no token uses
    rule: str  # which rule chose it, in words


# The tokenizer settings that name special tokens with a role in every text (never a mask).
ROLE_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token")
# Where a tokenizer folder keeps its chat template, besides tokenizer_config.json (transformers 5: .jinja).
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


@dataclass(frozen=True)
class TokenizerVocabulary:
    """Token id -> (string, special) for every token a tokenizer folder defines."""

    tokens: dict[int, tuple[str, bool]]
    mask_token: str | None
    role_tokens: frozenset[str] = frozenset()  # the bos/eos/pad/unk/sep/cls strings
    chat_template: str = ""  # every chat template of the folder, joined ("" when it has none)

    @classmethod
    def read(cls, folder: Path) -> TokenizerVocabulary | None:
        """From tokenizer.json (+ tokenizer_config.json); None when the folder has no tokenizer.json."""
        path = folder / "tokenizer.json"
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            settings = _json_file(folder / "tokenizer_config.json")
            special_map = _json_file(folder / "special_tokens_map.json")
            templates = [folder.joinpath(name).read_text(encoding="utf-8") for name in TEMPLATE_FILES
                         if folder.joinpath(name).is_file()]  # fmt: skip
        except (OSError, ValueError) as exc:
            raise ConfigError(f"target.path: cannot read the tokenizer in {folder}: {exc}") from exc
        tokens: dict[int, tuple[str, bool]] = {}
        vocab = (data.get("model") or {}).get("vocab") or {}
        if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel
            tokens.update({int(i): (str(t), False) for t, i in vocab.items()})
        elif isinstance(vocab, list):  # Unigram: [token, score] in id order
            tokens.update({i: (str(entry[0]), False) for i, entry in enumerate(vocab)})
        for added in data.get("added_tokens") or []:
            tokens[int(added["id"])] = (str(added["content"]), bool(added.get("special")))
        mask = _token_text(settings.get("mask_token"))
        roles = {
            _token_text(source.get(key)) for source in (settings, special_map) for key in ROLE_TOKEN_KEYS
        }
        template = settings.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
            template = " ".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
        templates.append(template if isinstance(template, str) else "")
        return cls(tokens, mask, frozenset(r for r in roles if r), "\n".join(templates))

    def id_of(self, text: str) -> int | None:
        return next((i for i, (t, _) in self.tokens.items() if t == text), None)

    def is_ordinary(self, token_id: int) -> bool:
        """A token the tokenizer writes for ordinary text (not special, not unused)."""
        entry = self.tokens.get(token_id)
        return entry is not None and not entry[1]

    def first_unused(self, vocab_size: int) -> int | None:
        return next((i for i in range(vocab_size) if i not in self.tokens), None)

    def first_spare_special(self, vocab_size: int) -> int | None:
        """The lowest-id special token that no chat holds: not written by the chat template, not a role
        token (bos, eos, pad, ...). A row the target never sees in a chat, so never one it writes there."""
        for token_id in sorted(self.tokens):
            text, special = self.tokens[token_id]
            spare = text not in self.role_tokens and text not in self.chat_template
            if special and token_id < vocab_size and spare:
                return token_id
        return None


def _json_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    """A token setting as its string: "<s>", or {"content": "<s>", ...} (AddedToken's JSON form)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def resolve_mask_token(
    target_path: str, model_type: str, vocab_size: int, configured: int | None, embedded: bool
) -> MaskToken:
    """The mask token for this target, by the rules of the module docstring."""
    vocabulary = None if embedded else TokenizerVocabulary.read(Path(target_path))

    def text_of(token_id: int) -> str | None:
        entry = vocabulary.tokens.get(token_id) if vocabulary else None
        return entry[0] if entry else None

    if configured is not None:
        if configured >= vocab_size:
            raise ConfigError(
                f"drafter.mask_token_id: must be < the target's vocab size {vocab_size}, got {configured}"
            )
        return MaskToken(configured, text_of(configured), RULE_CONFIG)
    if embedded and target_path == TINY:
        return MaskToken(vocab_size - 1, None, RULE_TINY)
    if vocabulary is not None and vocabulary.mask_token is not None:
        token_id = vocabulary.id_of(vocabulary.mask_token)
        if token_id is not None and token_id < vocab_size:
            return MaskToken(token_id, vocabulary.mask_token, RULE_TOKENIZER)
    for prefix, token_id, family in PUBLISHED_MASK_IDS:
        if not model_type.startswith(prefix):
            continue
        fits = token_id < vocab_size and (vocabulary is None or not vocabulary.is_ordinary(token_id))
        if fits:
            return MaskToken(token_id, text_of(token_id), RULE_PUBLISHED.format(family=family))
        break
    unused = vocabulary.first_unused(vocab_size) if vocabulary is not None else None
    if unused is not None:
        return MaskToken(unused, None, RULE_UNUSED)
    spare = vocabulary.first_spare_special(vocab_size) if vocabulary is not None else None
    if spare is not None:
        return MaskToken(spare, text_of(spare), RULE_SPARE_SPECIAL)
    raise ConfigError(
        f"drafter.mask_token_id: no default for this target (model_type {model_type!r}: no mask token in "
        "its tokenizer, no published value that fits, every embedding row is a token, every special token "
        "is written by the chat template or is bos/eos/pad/unk)",
        hint="set drafter.mask_token_id to a token id the target never emits (e.g. an unused special token)",
    )


def mask_token_of(cfg: TrainConfig) -> dict[str, Any]:
    """{"id", "text", "rule"} of a completed TrainConfig's drafter section (`train`'s plan and --dry-run --json)."""
    d = cfg.drafter
    return {"id": d.mask_token_id, "text": d.mask_token_text, "rule": d.mask_token_rule}
