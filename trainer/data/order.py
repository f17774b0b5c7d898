"""Which sequences make global batch i: a fresh permutation per epoch, fixed by (seed, epoch), so a run
resumes from a batch index alone and every rank agrees on it without talking."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from trainer.data.sources import SequenceSource


class BatchOrder:
    """Global batch index -> sequence ids: a fresh permutation per epoch, fixed by (seed, epoch).

    `sequences` is a count (ids 0..n-1) or the list of ids to draw from (the training part of a split)."""

    def __init__(self, sequences: int | list[int], batch_size: int, seed: int) -> None:
        self.pool = list(range(sequences)) if isinstance(sequences, int) else list(sequences)
        self.sequences, self.batch_size, self.seed = len(self.pool), batch_size, seed
        self.per_epoch = self.sequences // batch_size
        self._epoch, self._perm = -1, torch.empty(0, dtype=torch.int64)

    def sequence_ids(self, batch_index: int) -> list[int]:
        epoch, k = divmod(batch_index, self.per_epoch)
        if epoch != self._epoch:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + 104729 * epoch + 3)
            self._epoch, self._perm = epoch, torch.randperm(self.sequences, generator=gen)
        return [self.pool[i] for i in self._perm[k * self.batch_size : (k + 1) * self.batch_size].tolist()]


def make_batch(source: SequenceSource, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S) input_ids and loss_mask for the given sequence ids."""
    rows = [source.get(j) for j in ids]
    return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])


def make_padded_batch(source: SequenceSource, ids: list[int], rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`make_batch` grown to `rows` rows by copies of the first with nothing supervised: the held-out
    remainder past the last whole batch is scored at the compiled batch shape, and a row with no supervised
    token adds no anchor, no walk and no sequence to the held-out sums (issue 38, D8)."""
    input_ids, loss_mask = make_batch(source, ids)
    missing = rows - input_ids.shape[0]
    if missing <= 0:
        return input_ids, loss_mask
    pad_ids = input_ids[:1].expand(missing, -1)
    pad_mask = torch.zeros(missing, loss_mask.shape[1], dtype=loss_mask.dtype)
    return torch.cat([input_ids, pad_ids]), torch.cat([loss_mask, pad_mask])
