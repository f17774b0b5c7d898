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

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from dflash_base.errors import ConfigError
from trainer.data.answer_ends import AnswerEnds, finish_reasons, trim_answer_ends
from trainer.data.chat import (
    ChatSequence,
    TemplateMarks,
    chat_sequence,
    check_messages,
    check_tools,
    sequence_token_spans,
    span_mask,
)
from trainer.model.batch import PAD_ID
from trainer.runspec.config import DataSection, TrainConfig, heldout_sequences, num_sequences
from trainer.runspec.data_files import jsonl_records, record_problem
from trainer.target_model.load import cache_argument, load_target_model, returned_cache
from trainer.target_model.tokenizer import load_tokenizer


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


def padded(ids: torch.Tensor, mask: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A kept (unpadded, int32) sequence as `fit_to_length` gives it: int64 ids and a mask, right-padded."""
    input_ids = torch.full((seq_len,), PAD_ID, dtype=torch.int64)
    loss_mask = torch.zeros(seq_len, dtype=torch.bool)
    input_ids[: ids.numel()] = ids
    loss_mask[: mask.numel()] = mask
    return input_ids, loss_mask


# Tokens a source keeps of the sequences it has made (int32 ids and a bool mask: 5 bytes a token, ~1 GB):
# rendering a chat record through its template and tokenising it costs ~1 ms on a CPU core (SmolLM2's
# answers), a few tens of ms of every 32-sequence step the trainer's host thread spends before it can queue
# the GPU's work; every epoch after the first, and every held-out scoring after the first, reads them back.
KEPT_TOKENS = 200_000_000


# ---------------------------------------------------------------- sources


class JsonlSource:
    """Pre-tokenised sequences: {"input_ids": [ints], "loss_mask": [0/1 or bools, same length]}."""

    def __init__(self, path: str, seq_len: int, vocab_size: int, field: str = "data.path") -> None:
        self.seq_len = seq_len
        self.rows: list[tuple[list[int], list[bool]]] = []
        for number, record in jsonl_records(Path(path), field):
            problem = record_problem("jsonl", record, vocab_size)
            if problem is not None:
                raise ConfigError(f"{field}: {path} line {number}: {problem}")
            ids, mask = record["input_ids"], record["loss_mask"]
            self.rows.append((ids, [bool(m) for m in mask]))

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = self.rows[j]
        return fit_to_length(ids, mask, self.seq_len)


@dataclass(frozen=True)
class ChatTokens:
    """One chat record as trained: ids, loss mask, the located answers, what was left out at their ends."""

    ids: list[int]
    mask: list[bool]
    sequence: ChatSequence
    ends: AnswerEnds


class TokenizedSource:
    """`text` records (all tokens supervised) or `chat` records (assistant turns supervised), tokenised lazily.

    Chat records go through `trainer.data.chat` with the run's `data.chat_template_kwargs` and the record's
    `tools`; the template is probed once, so a template nobody can read is refused before any work. What the
    target did not write at an answer's end is left out of the loss (`trainer.data.answer_ends`, `loops`)."""

    def __init__(
        self,
        path: str,
        kind: str,
        tokenizer: Any,
        seq_len: int,
        template_kwargs: dict[str, Any] | None = None,
        field: str = "data.path",
        loops: str = "keep",
    ) -> None:
        self.kind, self.tokenizer, self.seq_len, self.path = kind, tokenizer, seq_len, path
        self.template_kwargs, self.field, self.loops = dict(template_kwargs or {}), field, loops
        self.records = jsonl_records(Path(path), field)
        needed = "text" if kind == "text" else "messages"
        for number, record in self.records:
            if needed not in record:
                raise ConfigError(f'{field}: {path} line {number}: a "{kind}" record needs "{needed}"')
        if kind == "chat":
            TemplateMarks.of(tokenizer, self.template_kwargs)
        self.kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # j -> the sequence, made once
        self.kept_tokens = 0

    def __len__(self) -> int:
        return len(self.records)

    def tokens(self, j: int) -> tuple[list[int], list[bool]]:
        """Record j's ids and loss mask before truncation and padding."""
        number, record = self.records[j]
        where = f"{self.field}: {self.path} line {number}"
        if self.kind == "text":
            if not isinstance(record["text"], str):
                raise ConfigError(f'{where}: "text" must be a string')
            ids = self.tokenizer(record["text"], add_special_tokens=True)["input_ids"]
            return ids, [True] * len(ids)
        chat = self.chat_tokens(j)
        return chat.ids, chat.mask

    def chat_tokens(self, j: int) -> ChatTokens:
        """Chat record j tokenised as trained, with its answers' ends trimmed (`trainer.data.answer_ends`)."""
        sequence = self.chat(j)
        ids, token_spans = sequence_token_spans(self.tokenizer, sequence)
        mask = span_mask(len(ids), token_spans)
        reasons = finish_reasons(self.records[j][1], sequence.answers)
        ends = trim_answer_ends(ids, mask, token_spans, sequence.span_answers, reasons, self.loops)
        return ChatTokens(ids, mask, sequence, ends)

    def chat(self, j: int) -> ChatSequence:
        """Chat record j as trained: its text, supervised spans, and answers left out of context (issue 38)."""
        number, record = self.records[j]
        where = f"{self.field}: {self.path} line {number}"
        messages = check_messages(record["messages"], where)
        tools = check_tools(record.get("tools"), where)
        return chat_sequence(self.tokenizer, messages, self.template_kwargs, tools, where)

    def made(self, j: int) -> tuple[list[int], list[bool]]:
        """Sequence j made from its record and truncated to seq_len, not padded: what `get` keeps, and what a
        data worker (`trainer.data.prefetch`) makes ahead, so both give the same sequence."""
        ids, mask = self.tokens(j)
        return ids[: self.seq_len], mask[: self.seq_len]

    def keep(self, j: int, ids: torch.Tensor, mask: torch.Tensor) -> bool:
        """Keep made sequence j (int32 ids, bool mask, unpadded) if KEPT_TOKENS has room; True if kept."""
        if j in self.kept:
            return True
        if self.kept_tokens + ids.numel() > KEPT_TOKENS:
            return False
        self.kept[j] = (ids, mask)
        self.kept_tokens += ids.numel()
        return True

    def get(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Sequence j at seq_len: tokenised the first time, read back from `kept` after (within KEPT_TOKENS)."""
        if (kept := self.kept.get(j)) is not None:
            return padded(*kept, self.seq_len)
        ids, mask = self.made(j)
        self.keep(j, torch.tensor(ids, dtype=torch.int32), torch.tensor(mask, dtype=torch.bool))
        return fit_to_length(ids, mask, self.seq_len)


# Records the start-of-run census renders: each costs 1 + 4 renders per answer (trainer.data.chat), a few ms
# for a 3-answer chat, so a bounded sample keeps a large file's start quick; `data preview` counts them all.
CENSUS_RECORDS = 256


def out_of_context_warning(source: SequenceSource, limit: int = CENSUS_RECORDS) -> str | None:
    """One line, with the count, when chat answers are left unsupervised because the template renders them in
    the later history differently from the context the target wrote them in (issue 38, Q1); else None."""
    if not isinstance(source, TokenizedSource) or source.kind != "chat":
        return None
    checked = min(len(source), limit)
    answers = left = 0
    for j in range(checked):
        chat = source.chat(j)
        answers, left = answers + chat.answers, left + chat.out_of_context
    if not left:
        return None
    scope = f"{checked}" if checked == len(source) else f"the first {checked} of {len(source)}"
    return (
        f"warning: {left} of {answers} answers in {scope} chat records are not supervised: the chat template "
        "renders them in the later history differently from the context the target wrote them in "
        "(`data preview --json` counts them all: answers_out_of_context)"
    )


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

    Made in chunks of `chunk` sequences with one generator per chunk, so sequence j does not depend on which
    rank makes it or in what order batches are asked for. `eager`: every chunk at once (training, before its
    loop); else a chunk the first time one of its sequences is asked for (`eval` reads a few held-out ones:
    the whole set took 575 s for a 4-prompt eval on a loaded CPU).
    """

    def __init__(
        self,
        model: nn.Module,
        data: DataSection,
        seed: int,
        mask_token_id: int,
        chunk: int = 64,
        eager: bool = True,
    ) -> None:
        self.model, self.data, self.seed, self.mask_token_id, self.chunk = (
            model,
            data,
            seed,
            mask_token_id,
            chunk,
        )
        self.seq_len = data.seq_len
        self._chunks: dict[int, torch.Tensor] = {}
        self.loss_mask = torch.arange(data.seq_len) >= data.prompt_len
        if eager:
            for c in range(-(-data.num_samples // chunk)):
                self._ids(c)

    def _ids(self, c: int) -> torch.Tensor:
        if c not in self._chunks:
            start = c * self.chunk
            count = min(self.chunk, self.data.num_samples - start)
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + 7919 * c + 1)
            d = self.data
            self._chunks[c] = sample_sequences(
                self.model, count, d.seq_len, d.prompt_len, d.temperature, self.mask_token_id, gen
            )
        return self._chunks[c]

    @property
    def ids(self) -> torch.Tensor:
        """Every sequence, (num_samples, seq_len) (made now where not yet)."""
        return torch.cat([self._ids(c) for c in range(-(-self.data.num_samples // self.chunk))])

    def __len__(self) -> int:
        return self.data.num_samples

    def get(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= j < self.data.num_samples:
            raise IndexError(j)
        return self._ids(j // self.chunk)[j % self.chunk].clone(), self.loss_mask.clone()


@torch.inference_mode()
def sample_sequences(
    model: Any,  # a Hugging Face causal LM
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
    cache_name = cache_argument(model)
    out = model(input_ids=ids, use_cache=True)
    cache = returned_cache(out, cache_name)
    tokens = [ids]
    while sum(t.shape[1] for t in tokens) < seq_len:
        logits = out.logits[:, -1, :].float() / temperature
        logits[:, mask_token_id] = float("-inf")
        probs = torch.softmax(logits, dim=-1).cpu()
        nxt = torch.multinomial(probs, 1, generator=gen).to(device)
        tokens.append(nxt)
        out = model(input_ids=nxt, use_cache=True, **{cache_name: cache})
        cache = returned_cache(out, cache_name)
    return torch.cat(tokens, dim=1).cpu()


def build_source(
    cfg: TrainConfig,
    device: torch.device,
    vocab_size: int,
    path: str | None = None,
    field: str = "data.path",
    eager: bool = True,
) -> SequenceSource:
    """The configured source (on target ranks: synthetic generation runs the tiny target on `device`).
    `path`/`field`: another file of the same kind (the held-out file, data.eval_path). `eager` False: synthetic
    sequences are made only when asked for (`eval` reads a few; training makes them all before its loop)."""
    d = cfg.data
    mask_id = cfg.drafter.mask_token_id
    assert mask_id is not None, "load_config fills drafter.mask_token_id"
    path = path or d.path
    if d.kind == "jsonl":
        return JsonlSource(str(path), d.seq_len, vocab_size, field)
    if d.kind in ("text", "chat"):
        return TokenizedSource(
            str(path),
            d.kind,
            load_tokenizer(cfg.target.path),
            d.seq_len,
            d.chat_template_kwargs,
            field,
            d.loops,
        )
    if d.kind == "random":
        return RandomSource(d.num_samples, d.seq_len, d.prompt_len, vocab_size, cfg.run.seed)
    model = load_target_model(cfg.target.path, cfg.run.seed, device, torch.float32)  # the tiny target
    return SyntheticSource(model, d, cfg.run.seed, mask_id, eager=eager)


@dataclass(frozen=True)
class DataSplit:
    """Which sequences train and which are held out; the same on every rank (counts and the seed only)."""

    train_ids: list[int]  # ids in the training source
    eval_ids: list[int]  # ids in the held-out source (the training source itself under eval_fraction)
    batch_size: int

    @property
    def eval_batches(self) -> int:
        """Batches of held-out sequences, the last one partial where the count is not a multiple of the batch
        size (it is padded with unsupervised rows to the compiled shape: every held-out sequence is scored)."""
        return -(-len(self.eval_ids) // self.batch_size)

    def describe_heldout(self) -> str:
        """What held-out evaluation scores, in one line."""
        if not self.eval_ids:
            return "no held-out data"
        partial = len(self.eval_ids) % self.batch_size
        last = f", the last of {partial}" if partial else ""
        return f"held-out: {len(self.eval_ids)} sequences, all scored in {self.eval_batches} batches of {self.batch_size}{last}"

    def eval_sequence_ids(self, eval_index: int) -> list[int]:
        b = self.batch_size
        return self.eval_ids[eval_index * b : (eval_index + 1) * b]


def split_data(cfg: TrainConfig) -> DataSplit:
    """`data.eval_fraction` of the sequences (a fixed draw by run.seed) or `data.eval_path`'s records held out."""
    b = cfg.optim.batch_size
    total = num_sequences(cfg)
    held = heldout_sequences(cfg, total)
    if cfg.data.eval_path is not None:
        return DataSplit(list(range(total)), list(range(held)), b)
    if held:  # data.eval_fraction's share of the training data, a fixed draw by the seed
        gen = torch.Generator().manual_seed(cfg.run.seed * 1_000_003 + 15485863)
        perm = torch.randperm(total, generator=gen).tolist()
        group = prompt_groups(cfg, total)
        held_groups = whole_groups(group, perm, held)
        eval_ids = [j for j in range(total) if group[j] in held_groups]
        return DataSplit([j for j in range(total) if group[j] not in held_groups], eval_ids, b)
    return DataSplit(list(range(total)), [], b)


def whole_groups(group: list[str | int], order: list[int], wanted: int) -> set[str | int]:
    """The prompts whose sequences are held out: taken whole, in `order`, until they hold `wanted` sequences.
    Taking the group of each of the first `wanted` sequences instead held out up to (samples per prompt) x the
    fraction asked for: 6% of a greedy + sampled set under `eval_fraction = 0.03`."""
    size = Counter(group)
    chosen: set[str | int] = set()
    count = 0
    for j in order:
        if count >= wanted:
            break
        if group[j] not in chosen:
            chosen.add(group[j])
            count += size[group[j]]
    return chosen


def prompt_groups(cfg: TrainConfig, total: int) -> list[str | int]:
    """Which prompt each sequence answers: a record's `prompt_id` (`data regenerate --samples-per-prompt`
    writes one per sample), else the sequence itself. The held-out split keeps a prompt's samples on one side:
    a held-out answer whose prompt was trained on, by another sample, scores the drafter on what it saw."""
    if cfg.data.kind in ("synthetic", "random"):
        return list(range(total))
    records = jsonl_records(Path(str(cfg.data.path)))
    return [r["prompt_id"] if isinstance(r.get("prompt_id"), str) else j for j, (_, r) in enumerate(records)]
