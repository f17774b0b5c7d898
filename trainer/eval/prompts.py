"""The prompts `eval` decodes: a prompts file (token ids, a prompt, or a chat rendered with the target's own
template and the record's tools, as a server renders it), or the run's held-out conversations up to their last
answer, each distinct prompt once."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dflash_base.errors import ConfigError
from trainer.runspec.data_files import jsonl_records

if TYPE_CHECKING:
    from trainer.runspec.config import TrainConfig


@dataclass
class EvalPrompts:
    """The prompts an eval decodes, with what their file says of each: its kind (a prompts file's `"kind"`,
    reported per kind) and whether it is a template twin of a training prompt (`"twin"`, reported apart)."""

    ids: list[list[int]]
    where: list[str]  # per prompt, where it came from: an error names it
    kinds: list[str | None] = field(default_factory=list)
    twins: list[bool | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.kinds = self.kinds or [None] * len(self.ids)
        self.twins = self.twins or [None] * len(self.ids)

    def first(self, count: int | None) -> EvalPrompts:
        """The first `count` prompts (None: all)."""
        if count is None:
            return self
        return EvalPrompts(self.ids[:count], self.where[:count], self.kinds[:count], self.twins[:count])

    def groups(self) -> dict[str, list[int]]:
        """Prompt indexes per group the file names: `kind:<name>` for each kind, `twin` and `no twin` where
        twins are marked. Empty when the file names neither."""
        out: dict[str, list[int]] = {}
        for i, (kind, twin) in enumerate(zip(self.kinds, self.twins, strict=True)):
            if kind is not None:
                out.setdefault(f"kind:{kind}", []).append(i)
            if twin is not None:
                out.setdefault("twin" if twin else "no twin", []).append(i)
        return out


def prompts_from_file(path: str, tokenizer: Any, template_kwargs: dict[str, Any]) -> list[list[int]]:
    """The token ids of `labelled_prompts`."""
    return labelled_prompts(path, tokenizer, template_kwargs).ids


def labelled_prompts(path: str, tokenizer: Any, template_kwargs: dict[str, Any]) -> EvalPrompts:
    """A JSONL of {"input_ids": [...]}, {"prompt": "..."} or {"messages": [...]} records (each may say its
    "kind" and whether it is a "twin"). A chat (and a prompt, as one user turn, the way `data regenerate` reads
    it) is rendered with the chat template's generation prompt (with the record's `tools`, as a server renders
    them); a prompt goes in as plain text only where the tokenizer has no chat template."""
    chat = getattr(tokenizer, "chat_template", None) is not None
    out = EvalPrompts([], [])
    for number, record in jsonl_records(Path(path), "--prompts"):
        where = f"--prompts: {path} line {number}"
        out.where.append(where)
        kind, twin = record.get("kind"), record.get("twin")
        out.kinds.append(str(kind) if isinstance(kind, str | int) and not isinstance(kind, bool) else None)
        out.twins.append(twin if isinstance(twin, bool) else None)
        if isinstance(record.get("input_ids"), list) and record["input_ids"]:
            out.ids.append([int(t) for t in record["input_ids"]])
            continue
        if tokenizer is None:
            raise ConfigError(f'{where}: this target has no tokenizer; give "input_ids"')
        if isinstance(record.get("prompt"), str) and not chat:
            out.ids.append(list(tokenizer(record["prompt"], add_special_tokens=True)["input_ids"]))
        elif isinstance(record.get("prompt"), str):
            user = [{"role": "user", "content": record["prompt"]}]
            out.ids.append(render_prompt(tokenizer, user, template_kwargs, record.get("tools"), where))
        elif isinstance(record.get("messages"), list):
            out.ids.append(
                render_prompt(tokenizer, record["messages"], template_kwargs, record.get("tools"), where)
            )
        else:
            raise ConfigError(f'{where}: needs "prompt", "messages" or "input_ids"')
    return out


def heldout_prompts(cfg: TrainConfig, prompt_len: int, count: int, tokenizer: Any = None) -> list[list[int]]:
    """Prompts from the run's first `count` held-out sequences (never trained on). Chat data: each held-out
    conversation up to its last answer, rendered with the generation prompt, the context the target wrote that
    answer in, each distinct prompt once (a prompt's greedy and sampled answers are two records of one prompt:
    decoding it twice measured nothing new); other data: the first `prompt_len` tokens of each sequence."""
    from trainer.data.sources import build_source, split_data
    from trainer.runspec.target_shapes import target_shapes

    split = split_data(cfg)
    if not split.eval_ids:
        raise ConfigError("--config: this run holds no data out (set data.eval_fraction or data.eval_path)")
    path, field_name = (
        (cfg.data.eval_path, "data.eval_path") if cfg.data.eval_path else (cfg.data.path, "data.path")
    )
    if cfg.data.kind == "chat":
        assert path is not None, "load_config requires data.path for chat data"
        return distinct_chat_prompts(
            Path(path), field_name, split.eval_ids, count, tokenizer, cfg.data.chat_template_kwargs
        )
    vocab = target_shapes(cfg.target.path).vocab_size
    source = build_source(cfg, torch.device("cpu"), vocab, path, field_name, eager=False)
    return [source.get(j)[0][:prompt_len].tolist() for j in split.eval_ids[:count]]


def chat_prompts(
    path: Path, field_name: str, ids: list[int], tokenizer: Any, template_kwargs: dict[str, Any]
) -> list[list[int]]:
    """Records `ids` of a chat file, each up to (not including) its last assistant turn, with the template's
    generation prompt (and the record's `tools`): where a server starts generating that answer."""
    records = jsonl_records(path, field_name)
    return [_chat_prompt(path, field_name, *records[j], tokenizer, template_kwargs) for j in ids]


def distinct_chat_prompts(
    path: Path, field_name: str, ids: list[int], count: int, tokenizer: Any, template_kwargs: dict[str, Any]
) -> list[list[int]]:
    """`chat_prompts` of `ids` in order, each distinct prompt once, until `count` of them."""
    records = jsonl_records(path, field_name)
    prompts: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for j in ids:
        if len(prompts) == count:
            break
        prompt = _chat_prompt(path, field_name, *records[j], tokenizer, template_kwargs)
        if tuple(prompt) not in seen:
            seen.add(tuple(prompt))
            prompts.append(prompt)
    return prompts


def _chat_prompt(
    path: Path, field_name: str, number: int, record: dict[str, Any], tokenizer: Any, kwargs: dict[str, Any]
) -> list[int]:
    before = before_last_answer(record["messages"])
    if not before:
        raise ConfigError(f"{field_name}: {path} line {number}: no turn before the answer to prompt with")
    where = f"{field_name}: {path} line {number}"
    return render_prompt(tokenizer, before, kwargs, record.get("tools"), where)


def render_prompt(
    tokenizer: Any, messages: list[dict[str, Any]], template_kwargs: dict[str, Any], tools: Any, where: str
) -> list[int]:
    """A chat's generation prompt as a server renders it: a record's `tools` go to the template as `tools=`
    (vLLM's and SGLang's chat endpoints pass the request's tools the same way; issue 38, Q6), so the target
    continues from the tool definitions `train` renders for it too."""
    from trainer.data.chat import check_tools
    from trainer.engine.target import prompt_ids

    checked = check_tools(tools, where)
    return prompt_ids(tokenizer, messages, {**template_kwargs, **({"tools": checked} if checked else {})})


def before_last_answer(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The turns before a conversation's last assistant turn (all of them when it has none)."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=len(messages))
    return messages[:last]
