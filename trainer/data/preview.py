"""What the trainer will see of a data set: the first records as it tokenises them, and counts over all.

`dflash-doctor data preview` renders this. The records go through the very sources the target ranks use
(`trainer.data.sources.build_source`: same tokenizer, chat template and kwargs, truncation and padding), so a
preview cannot disagree with training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.data.answer_ends import AnswerEnds
from trainer.data.sources import JsonlSource, SequenceSource, TokenizedSource, build_source, fit_to_length
from trainer.model.batch import real_token_count
from trainer.runspec.config import TrainConfig
from trainer.runspec.target_shapes import is_embedded, target_shapes
from trainer.target_model.tokenizer import load_tokenizer


@dataclass
class Sample:
    index: int  # the record's position in the data (file order)
    line: int | None  # its line in the file (None for generated data)
    input_ids: list[int]  # fixed to data.seq_len, as trained
    loss_mask: list[int]
    real_tokens: int  # before the padding
    tokens: list[str] | None  # each id as the tokenizer writes it (None without a tokenizer)
    truncated: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "line": self.line,
            "input_ids": self.input_ids,
            "loss_mask": self.loss_mask,
            "real_tokens": self.real_tokens,
            "tokens": self.tokens,
            "truncated": self.truncated,
        }


@dataclass
class Counts:
    sequences: int = 0
    tokens: int = 0  # real tokens after truncation (padding not counted)
    supervised: int = 0
    truncated: int = 0  # sequences longer than data.seq_len
    answers: int = 0  # assistant messages (chat data)
    answers_out_of_context: int = 0  # not supervised: the template re-renders their context (issue 38, Q1)
    # at answers' ends, what the target did not write (trainer.data.answer_ends): not supervised
    ends: AnswerEnds = field(default_factory=AnswerEnds)

    def to_json(self) -> dict[str, Any]:
        return {
            "sequences": self.sequences,
            "tokens": self.tokens,
            "supervised_tokens": self.supervised,
            "supervised_share": self.supervised / self.tokens if self.tokens else 0.0,
            "truncated_sequences": self.truncated,
            "truncated_share": self.truncated / self.sequences if self.sequences else 0.0,
            "answers": self.answers,
            "answers_out_of_context": self.answers_out_of_context,
            "answers_cut_at_length": self.ends.unfinished,
            "answers_loop_cut": self.ends.loops_cut,
            "answers_loop_dropped": self.ends.loops_dropped,
            "tokens_left_out_at_answer_ends": self.ends.tokens_left_out,
        }


@dataclass
class DataPreview:
    kind: str
    seq_len: int
    samples: list[Sample] = field(default_factory=list)
    counts: Counts = field(default_factory=Counts)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "seq_len": self.seq_len,
            "samples": [s.to_json() for s in self.samples],
            "counts": self.counts.to_json(),
        }


def _raw_length(source: SequenceSource, j: int) -> int | None:
    """Record j's length before truncation, where the source has one."""
    if isinstance(source, TokenizedSource):
        return len(source.tokens(j)[0])
    if isinstance(source, JsonlSource):
        return len(source.rows[j][0])
    return None


def _line(source: SequenceSource, j: int) -> int | None:
    if isinstance(source, TokenizedSource):
        return source.records[j][0]
    return None


def preview(cfg: TrainConfig, samples: int) -> DataPreview:
    """The first `samples` records and counts over every record of cfg's data (training file)."""
    vocab = target_shapes(cfg.target.path).vocab_size
    source = build_source(cfg, torch.device("cpu"), vocab)
    tokenizer = None if is_embedded(cfg.target.path) else load_tokenizer(cfg.target.path)
    out = DataPreview(cfg.data.kind, cfg.data.seq_len)
    for j in range(len(source)):
        if isinstance(source, TokenizedSource) and source.kind == "chat":
            chat = source.chat_tokens(
                j
            )  # rendered and tokenised once: the sequence as trained, and its counts
            ids, mask = fit_to_length(chat.ids, chat.mask, cfg.data.seq_len)
            raw: int | None = len(chat.ids)
            out.counts.answers += chat.sequence.answers
            out.counts.answers_out_of_context += chat.sequence.out_of_context
            out.counts.ends.add(chat.ends)
        else:
            ids, mask = source.get(j)
            raw = _raw_length(source, j)
        truncated = raw is not None and raw > cfg.data.seq_len
        real = real_token_count(ids.unsqueeze(0), mask.unsqueeze(0))
        out.counts.sequences += 1
        out.counts.tokens += real
        out.counts.supervised += int(mask.sum())
        out.counts.truncated += int(truncated)
        if j < samples:
            shown = ids[:real].tolist()
            out.samples.append(
                Sample(
                    index=j,
                    line=_line(source, j),
                    input_ids=ids.tolist(),
                    loss_mask=[int(m) for m in mask.tolist()],
                    real_tokens=real,
                    tokens=[tokenizer.decode([t]) for t in shown] if tokenizer is not None else None,
                    truncated=truncated,
                )
            )
    return out
