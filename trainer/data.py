"""Training sequences at a fixed length, in an order that depends only on (seed, epoch).

Sources give sequence j as (input_ids, loss_mask), padded or truncated to `seq_len` (padding never
supervised). `BatchOrder` maps a *global batch index* to sequence ids; that index is the data position a run
resumes from: drafter d at step s trains on global batch s*M + d, whichever target rank produced it.
Kinds: `jsonl` ({"input_ids": [...], "loss_mask": [...]} per line), `text` ({"text": ...}) and `chat`
({"messages": [{"role", "content"}, ...]}, loss on assistant turns) through the target folder's tokenizer,
`synthetic` (sequences the tiny target samples itself, so there is something to learn) and `random`
(uniform token ids: shapes for throughput runs, nothing to learn).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from dflash_doctor.errors import ConfigError
from trainer.config import DataSection, TrainConfig
from trainer.data_files import count_records, jsonl_records, record_problem

PAD_ID = 0  # the id written into padding; never supervised, never attended as context before an anchor


class SequenceSource(Protocol):
    def __len__(self) -> int: ...
    def get(self, j: int) -> tuple[torch.Tensor, torch.Tensor]: ...  # (S,) int64, (S,) bool


def fit_to_length(ids: list[int], mask: list[bool], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncate or right-pad to seq_len; padded positions get loss_mask False."""
    ids, mask = ids[:seq_len], mask[:seq_len]
    pad = seq_len - len(ids)
    input_ids = torch.tensor(list(ids) + [PAD_ID] * pad, dtype=torch.int64)
    loss_mask = torch.tensor([bool(m) for m in mask] + [False] * pad, dtype=torch.bool)
    return input_ids, loss_mask


# ---------------------------------------------------------------- sources


class JsonlSource:
    """Pre-tokenised sequences: {"input_ids": [ints], "loss_mask": [0/1 or bools, same length]}."""

    def __init__(self, path: str, seq_len: int, vocab_size: int) -> None:
        self.seq_len = seq_len
        self.rows: list[tuple[list[int], list[bool]]] = []
        for number, record in jsonl_records(Path(path)):
            problem = record_problem("jsonl", record, vocab_size)
            if problem is not None:
                raise ConfigError(f"data.path: {path} line {number}: {problem}")
            ids, mask = record["input_ids"], record["loss_mask"]
            self.rows.append((ids, [bool(m) for m in mask]))

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = self.rows[j]
        return fit_to_length(ids, mask, self.seq_len)


class TokenizedSource:
    """`text` records (all tokens supervised) or `chat` records (assistant turns supervised), tokenised lazily."""

    def __init__(self, path: str, kind: str, tokenizer: Any, seq_len: int) -> None:
        self.kind, self.tokenizer, self.seq_len = kind, tokenizer, seq_len
        self.records = jsonl_records(Path(path))
        field = "text" if kind == "text" else "messages"
        for number, record in self.records:
            if field not in record:
                raise ConfigError(f'data.path: {path} line {number}: a "{kind}" record needs "{field}"')

    def __len__(self) -> int:
        return len(self.records)

    def get(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        _, record = self.records[j]
        if self.kind == "text":
            ids = self.tokenizer(record["text"], add_special_tokens=True)["input_ids"]
            return fit_to_length(ids, [True] * len(ids), self.seq_len)
        ids, mask = chat_tokens_and_mask(self.tokenizer, record["messages"])
        return fit_to_length(ids, mask, self.seq_len)


def _template_ids(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt)
    if isinstance(out, dict) or hasattr(out, "keys"):  # newer transformers return a BatchEncoding
        out = out["input_ids"]
    return list(out)


def chat_tokens_and_mask(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[bool]]:
    """Tokens of the whole conversation; True on the tokens each assistant turn adds (not its header).

    Each assistant span is the difference between the template up to that turn (with the generation prompt,
    so the header is context) and the template including it.
    """
    ids = _template_ids(tokenizer, messages, generation_prompt=False)
    mask = [False] * len(ids)
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        start = len(_template_ids(tokenizer, messages[:i], generation_prompt=True)) if i else 0
        end = len(_template_ids(tokenizer, messages[: i + 1], generation_prompt=False))
        for k in range(start, min(end, len(ids))):
            mask[k] = True
    return ids, mask


class RandomSource:
    """Uniform random ids (never the mask token); everything after the prompt supervised. For throughput."""

    def __init__(self, num_samples: int, seq_len: int, prompt_len: int, vocab_size: int, seed: int) -> None:
        self.num_samples, self.seq_len, self.prompt_len = num_samples, seq_len, prompt_len
        self.vocab_size, self.seed = vocab_size, seed

    def __len__(self) -> int:
        return self.num_samples

    def get(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + j)
        ids = torch.randint(0, self.vocab_size - 1, (self.seq_len,), generator=gen)
        mask = torch.arange(self.seq_len) >= self.prompt_len
        return ids, mask


class SyntheticSource:
    """Sequences the tiny target samples from random prompts at a low temperature, fixed by the seed.

    Generated once, in chunks of `chunk` sequences with one generator per chunk, so sequence j does not
    depend on which rank generates it or in what order batches are asked for.
    """

    def __init__(
        self, model: nn.Module, data: DataSection, seed: int, mask_token_id: int, chunk: int = 64
    ) -> None:
        self.seq_len = data.seq_len
        ids_chunks = []
        for start in range(0, data.num_samples, chunk):
            count = min(chunk, data.num_samples - start)
            gen = torch.Generator().manual_seed(seed * 1_000_003 + 7919 * (start // chunk) + 1)
            ids_chunks.append(
                sample_sequences(
                    model, count, data.seq_len, data.prompt_len, data.temperature, mask_token_id, gen
                )
            )
        self.ids = torch.cat(ids_chunks)
        self.loss_mask = (torch.arange(data.seq_len) >= data.prompt_len).expand_as(self.ids)

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def get(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ids[j].clone(), self.loss_mask[j].clone()


def _cache_kwarg(model: nn.Module) -> str:
    """transformers renamed `past_key_values` to `cache`; ask the signature which one this version takes."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@torch.inference_mode()
def sample_sequences(
    model: nn.Module,
    count: int,
    seq_len: int,
    prompt_len: int,
    temperature: float,
    mask_token_id: int,
    gen: torch.Generator,
) -> torch.Tensor:
    """(count, seq_len) ids: a random prompt, then tokens sampled with a KV cache (the mask id never drawn)."""
    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (count, prompt_len), generator=gen)
    prompt[prompt == mask_token_id] = 0
    ids = prompt.to(device)
    cache_name = _cache_kwarg(model)
    out = model(input_ids=ids, use_cache=True)
    cache = getattr(out, cache_name, None) or out.past_key_values
    tokens = [ids]
    while sum(t.shape[1] for t in tokens) < seq_len:
        logits = out.logits[:, -1, :].float() / temperature
        logits[:, mask_token_id] = float("-inf")
        probs = torch.softmax(logits, dim=-1).cpu()
        nxt = torch.multinomial(probs, 1, generator=gen).to(device)
        tokens.append(nxt)
        out = model(input_ids=nxt, use_cache=True, **{cache_name: cache})
        cache = getattr(out, cache_name, None) or out.past_key_values
    return torch.cat(tokens, dim=1).cpu()


def build_source(cfg: TrainConfig, device: torch.device, vocab_size: int) -> SequenceSource:
    """The configured source (on target ranks: synthetic generation runs the tiny target on `device`)."""
    d = cfg.data
    mask_id = cfg.drafter.mask_token_id
    assert mask_id is not None, "load_config fills drafter.mask_token_id"
    if d.kind == "jsonl":
        return JsonlSource(str(d.path), d.seq_len, vocab_size)
    if d.kind in ("text", "chat"):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(cfg.target.path, local_files_only=True)
        return TokenizedSource(str(d.path), d.kind, tokenizer, d.seq_len)
    if d.kind == "random":
        return RandomSource(d.num_samples, d.seq_len, d.prompt_len, vocab_size, cfg.run.seed)
    from trainer.tiny import build_embedded_target

    model = build_embedded_target(cfg.target.path, cfg.run.seed, device)
    return SyntheticSource(model, d, cfg.run.seed, mask_id)


def num_sequences(cfg: TrainConfig) -> int:
    """How many sequences the data holds, cheaply (every rank plans the run from it)."""
    if cfg.data.kind in ("synthetic", "random"):
        return cfg.data.num_samples
    return count_records(str(cfg.data.path))


# ---------------------------------------------------------------- order and plan


@dataclass(frozen=True)
class RunPlan:
    """How many global batches and steps the run has; the same on every rank."""

    batches_per_epoch: int
    total_steps: int
    drafters: int

    @property
    def total_batches(self) -> int:
        return self.total_steps * self.drafters


def plan_run(cfg: TrainConfig, sequences: int) -> RunPlan:
    """steps, or epochs over the data rounded down to whole steps (each step takes one batch per drafter)."""
    o, m = cfg.optim, cfg.topology.drafters
    per_epoch = sequences // o.batch_size
    if per_epoch == 0:
        raise ConfigError(
            f"optim.batch_size: must be <= the {sequences} sequences of the data, got {o.batch_size}"
        )
    steps = o.steps if o.steps is not None else int(per_epoch * float(o.epochs or 0)) // m
    if steps < 1:
        raise ConfigError(f"optim.epochs: too few for one step of {m} drafter batches, got {o.epochs}")
    return RunPlan(per_epoch, steps, m)


class BatchOrder:
    """Global batch index -> sequence ids: a fresh permutation per epoch, fixed by (seed, epoch)."""

    def __init__(self, sequences: int, batch_size: int, seed: int) -> None:
        self.sequences, self.batch_size, self.seed = sequences, batch_size, seed
        self.per_epoch = sequences // batch_size
        self._epoch, self._perm = -1, torch.empty(0, dtype=torch.int64)

    def sequence_ids(self, batch_index: int) -> list[int]:
        epoch, k = divmod(batch_index, self.per_epoch)
        if epoch != self._epoch:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + 104729 * epoch + 3)
            self._epoch, self._perm = epoch, torch.randperm(self.sequences, generator=gen)
        return self._perm[k * self.batch_size : (k + 1) * self.batch_size].tolist()


def make_batch(source: SequenceSource, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S) input_ids and loss_mask for the given sequence ids."""
    rows = [source.get(j) for j in ids]
    return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])


def batches_of_target(target_rank: int, num_targets: int, first_batch: int, total_batches: int) -> range:
    """The global batches target t produces, from the resume point on: every i with i % N == t."""
    start = first_batch + (target_rank - first_batch) % num_targets
    return range(start, total_batches, num_targets)
