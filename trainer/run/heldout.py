"""Held-out evaluation: the acceptance length a greedy server would see, on sequences never trained on.

For each anchor a the drafter proposes slots 1..B-1 (one forward, as in serving). A greedy server accepts
slot k when it equals the target's greedy choice after the accepted prefix, then adds one token of its own
(the bonus token), so the acceptance length of one verify forward is 1 + the leading accepted slots.

- Against the target: the target's greedy choice for position a+k given the data prefix is
  `target_ids[a+k-1]` (sent by the target rank). That is the choice after the *accepted* prefix only while
  the data follow the target's greedy path, so slot k counts only when every earlier slot's data token was
  the target's greedy token too; the figure is therefore exact on data the target wrote greedily, and a
  lower bound elsewhere. `dflash-doctor eval` measures the real thing by decoding.
- Against the data labels: slot k accepted when it equals the data token at a+k (the training figure's
  rule, on unseen data).

Anchors are drawn like training's (same count, so compiled shapes are reused) from a generator fixed per
held-out batch: every evaluation of a run scores the same anchors, and its figures are comparable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import Tensor, nn

from trainer.model.anchors import sample_anchors
from trainer.model.batch import CapturedBatch
from trainer.model.device import autocast_for
from trainer.model.drafter import DFlashDrafter
from trainer.model.loss import block_targets
from trainer.run.schedule import evaluates_after

if TYPE_CHECKING:
    from trainer.data.sources import DataSplit
    from trainer.spec.config import TrainConfig

EVAL_SEED_OFFSET = 2_000_003  # held-out anchors: their own generator stream, apart from training's


@dataclass
class HeldoutSums:
    """Sums over held-out anchors (add them over batches and drafter ranks, then divide)."""

    accept_target: float = 0.0  # sum of acceptance lengths against the target's greedy tokens
    accept_labels: float = 0.0  # ... against the data labels
    anchors: float = 0.0
    sequences: int = 0

    def add(self, other: HeldoutSums) -> None:
        self.accept_target += other.accept_target
        self.accept_labels += other.accept_labels
        self.anchors += other.anchors
        self.sequences += other.sequences

    def as_tensor(self, device: torch.device) -> Tensor:
        values = [self.accept_target, self.accept_labels, self.anchors, float(self.sequences)]
        return torch.tensor(values, dtype=torch.float64, device=device)

    @classmethod
    def from_tensor(cls, t: Tensor) -> HeldoutSums:
        a, b, c, d = t.double().cpu().tolist()
        return cls(a, b, c, int(d))

    @property
    def accept_len_target(self) -> float:
        return self.accept_target / max(self.anchors, 1.0)

    @property
    def accept_len_labels(self) -> float:
        return self.accept_labels / max(self.anchors, 1.0)


def leading_run(hits: Tensor) -> Tensor:
    """(..., K) bool -> (...,) the number of leading True values."""
    return hits.long().cumprod(dim=-1).sum(dim=-1)


def acceptance_hits(
    draft: Tensor, input_ids: Tensor, target_ids: Tensor, anchors: Tensor, supervised: Tensor
) -> tuple[Tensor, Tensor]:
    """Per slot k >= 1: accepted against the target, and against the labels. (B, N, block-1) each.

    draft (B, N, block-1): the drafter's tokens for slots 1..; supervised (B, N, block) from block_targets.
    """
    seq_len = input_ids.shape[1]
    block = draft.shape[-1] + 1
    slots = torch.arange(1, block, device=anchors.device)
    positions = anchors.unsqueeze(-1) + slots  # (B, N, block-1): a + k
    on = supervised[..., 1:]
    safe = positions.clamp(max=seq_len - 1).flatten(1)
    labels = torch.gather(input_ids, 1, safe).view_as(positions)  # x[a+k]
    greedy = torch.gather(target_ids, 1, (positions - 1).clamp(max=seq_len - 1).flatten(1)).view_as(
        positions
    )  # g[a+k-1]
    on_greedy_path = labels == greedy  # the data token at a+k is the target's greedy one
    exact_so_far = torch.ones_like(on_greedy_path)
    exact_so_far[..., 1:] = on_greedy_path[..., :-1].long().cumprod(dim=-1).bool()
    vs_target = (draft == greedy) & on & exact_so_far
    vs_labels = (draft == labels) & on
    return vs_target, vs_labels


def score_batch(model: DFlashDrafter, batch: CapturedBatch, anchors_per_seq: int, seed: int) -> HeldoutSums:
    """One held-out batch's acceptance sums (the batch must carry the target's greedy tokens)."""
    assert batch.target_ids is not None, "a held-out batch carries target_ids"
    block = model.cfg.block_size
    gen = torch.Generator(device=batch.input_ids.device).manual_seed(seed + EVAL_SEED_OFFSET + batch.index)
    anchors, valid = sample_anchors(batch.loss_mask, anchors_per_seq, block, gen)
    draft = model.draft_tokens(batch.input_ids, batch.hidden, anchors, valid)
    _, supervised = block_targets(batch.input_ids, batch.loss_mask, anchors, valid, block)
    vs_target, vs_labels = acceptance_hits(draft, batch.input_ids, batch.target_ids, anchors, supervised)
    weight = valid.float()
    return HeldoutSums(
        accept_target=float(((1 + leading_run(vs_target)) * weight).sum()),
        accept_labels=float(((1 + leading_run(vs_labels)) * weight).sum()),
        anchors=float(weight.sum()),
        sequences=batch.batch_size,
    )


def evaluate_heldout(
    model: DFlashDrafter, batches: Iterable[CapturedBatch], anchors_per_seq: int, seed: int
) -> HeldoutSums:
    """Score held-out batches (from a receiver, or straight from a colocated target) in eval mode."""
    was_training = model.training
    model.eval()
    total = HeldoutSums()
    try:
        for batch in batches:
            total.add(score_batch(model, batch, anchors_per_seq, seed))
    finally:
        model.train(was_training)
    return total


def score_heldout(
    model: nn.Module, batches: Iterable[CapturedBatch], cfg: TrainConfig, device: torch.device
) -> HeldoutSums:
    """Held-out scoring as a run does it (the run's autocast, anchors and seed); the warm-up calls this too,
    so the graphs it compiles are the ones the first evaluation runs."""
    with autocast_for(cfg, device):
        return evaluate_heldout(model, batches, cfg.optim.anchors, cfg.run.seed)  # type: ignore[arg-type]


class HeldoutEvaluator:
    """Decides when a run scores its held-out data (`eval.every`, and after the last step; never without
    held-out data) and scores this drafter's share of the batches (j % drafters == index), summed over the
    drafter ranks."""

    def __init__(
        self,
        cfg: TrainConfig,
        split: DataSplit,
        total_steps: int,
        index: int,
        group: dist.ProcessGroup,
        device: torch.device,
    ) -> None:
        self.cfg, self.batches, self.total_steps = cfg, split.eval_batches, total_steps
        self.index, self.group, self.device = index, group, device

    def due(self, step_done: int) -> bool:
        return bool(self.batches) and evaluates_after(step_done, self.total_steps, self.cfg.eval.every)

    def run(self, model: nn.Module, heldout_batch: Callable[[int], CapturedBatch]) -> HeldoutSums:
        mine = range(self.index, self.batches, dist.get_world_size(self.group))
        sums = score_heldout(model, (heldout_batch(j) for j in mine), self.cfg, self.device)
        packed = sums.as_tensor(self.device)
        dist.all_reduce(packed, group=self.group)
        return HeldoutSums.from_tensor(packed)
