"""Held-out evaluation: the acceptance length a greedy server would see, on sequences never trained on.

For an anchor a the drafter proposes slots 1..B-1 (one forward, as in serving). A greedy server accepts slot
k when it equals the target's greedy choice after the accepted prefix, then adds one token of its own (the
bonus token), so one verify forward emits A(a) = 1 + the leading accepted slots.

- Against the target (the headline): the target's greedy choice for position a+k given the data prefix is
  `target_ids[a+k-1]` (sent by the target rank). That is the choice after the *accepted* prefix only while
  the data follow the target's greedy path, so slot k counts only when every earlier slot's data token was
  the target's greedy token too: exact on data the target wrote greedily, a lower bound elsewhere.
- Against the data labels: slot k accepted when it equals the data token at a+k (the training figure's
  rule, on unseen data), averaged over every anchor.

Every position of an answer is scored as an anchor (in chunks of training's anchor count, so the compiled
shapes are training's), and the headline walks each answer the way decoding does: start at its first token,
emit A(a) tokens (at most to the answer's end), move to a + A(a), repeat; tokens / forwards. Decoding lands
on positions with a bias: a long accepted run is crossed in one forward, so its many easy positions are
never anchors. A mean of A over uniformly sampled anchors counts them all and ran 26-37% above real decoding
on chat data. The walk follows `dflash-doctor eval`'s rule, but over every supervised answer of each held-out
sequence, where `eval`'s default prompts decode each conversation's last answer (docs/eval.md); the walk over
each sequence's last answer alone is kept beside it (`accept_len_last_answer`), the figure to hold against `eval`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import Tensor, nn

from trainer.model.anchors import valid_anchor_positions
from trainer.model.batch import CapturedBatch
from trainer.model.device import autocast_for
from trainer.model.drafter import DFlashDrafter
from trainer.model.loss import block_targets
from trainer.run.schedule import evaluates_after

if TYPE_CHECKING:
    from trainer.runspec.config import EvalSection, PrecisionSection


@dataclass
class HeldoutSums:
    """Sums over held-out answers (add them over batches and drafter ranks, then divide)."""

    walk_tokens: float = 0.0  # tokens the decoding walks emitted, against the target's greedy tokens
    walk_forwards: float = 0.0  # verify forwards those walks took
    accept_labels: float = 0.0  # sum over every anchor of its acceptance length against the data labels
    anchors: float = 0.0
    # held-out sequences with a supervised token (a padding row of the last batch has none)
    sequences: int = 0
    # the walks over each sequence's last answer alone: what `eval`'s default prompts decode (docs/eval.md)
    last_tokens: float = 0.0
    last_forwards: float = 0.0

    def add(self, other: HeldoutSums) -> None:
        for name in (f.name for f in fields(self)):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_tensor(self, device: torch.device) -> Tensor:
        """Every sum in field order, for one all-reduce."""
        values = [float(getattr(self, f.name)) for f in fields(self)]
        return torch.tensor(values, dtype=torch.float64, device=device)

    @classmethod
    def from_tensor(cls, t: Tensor) -> HeldoutSums:
        zero, values = cls(), t.double().cpu().tolist()  # each field back to its own type (sequences: int)
        return cls(
            **{f.name: type(getattr(zero, f.name))(v) for f, v in zip(fields(cls), values, strict=True)}
        )

    @property
    def accept_len_target(self) -> float:
        """Tokens per verify forward of greedy decoding with this drafter on these answers (the headline)."""
        return self.walk_tokens / max(self.walk_forwards, 1.0)

    @property
    def accept_len_last_answer(self) -> float:
        """The same walk over each held-out sequence's last answer only: the answers `eval` decodes."""
        return self.last_tokens / max(self.last_forwards, 1.0)

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


def every_anchor(loss_mask: Tensor, chunk: int) -> tuple[Tensor, Tensor]:
    """Every valid anchor of each row, ascending, padded to a multiple of `chunk`: anchors, valid (B, M)."""
    candidates = valid_anchor_positions(loss_mask)
    batch, seq_len = candidates.shape
    count = int(candidates.sum(dim=1).max()) if candidates.numel() else 0
    width = max(chunk, -(-count // chunk) * chunk)
    positions = torch.arange(seq_len, device=loss_mask.device).expand(batch, seq_len)
    keyed = torch.where(candidates, positions, torch.full_like(positions, seq_len))
    ordered, _ = torch.sort(keyed, dim=1)
    ordered = (
        ordered[:, :width]
        if width <= seq_len
        else torch.cat([ordered, ordered.new_full((batch, width - seq_len), seq_len)], dim=1)
    )
    valid = ordered < seq_len
    return torch.where(valid, ordered, torch.zeros_like(ordered)), valid


def answer_walks(accept: dict[int, int], loss_mask: list[bool]) -> list[tuple[int, int]]:
    """(tokens, forwards) of greedy speculative decoding over each answer of one sequence, in order: from the
    answer's first token, a verify forward at anchor a emits accept[a] tokens, cut at the answer's end."""
    walks: list[tuple[int, int]] = []
    position, length = 0, len(loss_mask)
    while position < length:
        if not loss_mask[position]:
            position += 1
            continue
        end = position
        while end + 1 < length and loss_mask[end + 1]:
            end += 1
        anchor = position  # the answer's first token comes from the prefill; verifying starts after it
        tokens = forwards = 0
        while anchor < end:
            emitted = min(accept.get(anchor, 1), end - anchor)
            tokens, forwards, anchor = tokens + emitted, forwards + 1, anchor + emitted
        walks.append((tokens, forwards))
        position = end + 1
    return walks


def score_batch(model: DFlashDrafter, batch: CapturedBatch, anchors_per_seq: int) -> HeldoutSums:
    """One held-out batch's sums (the batch must carry the target's greedy tokens): every anchor scored, in
    chunks of `anchors_per_seq` (training's compiled shapes), then each answer walked as decoding walks it."""
    assert batch.target_ids is not None, "a held-out batch carries target_ids"
    block = model.cfg.block_size
    all_anchors, all_valid = every_anchor(batch.loss_mask, anchors_per_seq)
    vs_target_parts, vs_labels_parts = [], []
    for start in range(0, all_anchors.shape[1], anchors_per_seq):
        anchors = all_anchors[:, start : start + anchors_per_seq].contiguous()
        valid = all_valid[:, start : start + anchors_per_seq].contiguous()
        draft = model.draft_tokens(batch.input_ids, batch.hidden, anchors, valid)
        _, supervised = block_targets(batch.input_ids, batch.loss_mask, anchors, valid, block)
        vs_target, vs_labels = acceptance_hits(draft, batch.input_ids, batch.target_ids, anchors, supervised)
        vs_target_parts.append(leading_run(vs_target))
        vs_labels_parts.append(leading_run(vs_labels))
    accept_target = (1 + torch.cat(vs_target_parts, dim=1)).tolist()
    accept_labels = 1 + torch.cat(vs_labels_parts, dim=1)
    weight = all_valid.float()
    walk_tokens = walk_forwards = last_tokens = last_forwards = 0
    masks, anchor_rows, valid_rows = batch.loss_mask.bool().tolist(), all_anchors.tolist(), all_valid.tolist()
    for row, mask in enumerate(masks):
        accept = {
            a: n for a, n, ok in zip(anchor_rows[row], accept_target[row], valid_rows[row], strict=True) if ok
        }
        walks = answer_walks(accept, mask)
        walk_tokens += sum(t for t, _ in walks)
        walk_forwards += sum(f for _, f in walks)
        if walks:
            last_tokens, last_forwards = last_tokens + walks[-1][0], last_forwards + walks[-1][1]
    return HeldoutSums(
        walk_tokens=float(walk_tokens),
        walk_forwards=float(walk_forwards),
        accept_labels=float((accept_labels * weight).sum()),
        anchors=float(weight.sum()),
        sequences=int(batch.loss_mask.bool().any(dim=1).sum()),
        last_tokens=float(last_tokens),
        last_forwards=float(last_forwards),
    )


def evaluate_heldout(
    model: DFlashDrafter, batches: Iterable[CapturedBatch], anchors_per_seq: int
) -> HeldoutSums:
    """Score held-out batches (from a receiver, or straight from a colocated target) in eval mode."""
    was_training = model.training
    model.eval()
    total = HeldoutSums()
    try:
        for batch in batches:
            total.add(score_batch(model, batch, anchors_per_seq))
    finally:
        model.train(was_training)
    return total


def score_heldout(
    model: nn.Module,
    batches: Iterable[CapturedBatch],
    precision: PrecisionSection,
    anchors_per_seq: int,
    device: torch.device,
) -> HeldoutSums:
    """Held-out scoring as a run does it (the run's autocast and anchor count: `optim.anchors`); the warm-up
    calls this too, so the graphs it compiles are the ones the first evaluation runs."""
    with autocast_for(precision, device):
        return evaluate_heldout(model, batches, anchors_per_seq)  # type: ignore[arg-type]


class HeldoutEvaluator:
    """Decides when a run scores its held-out data (`eval.every`, and after the last step; never without
    held-out data) and scores this drafter's share of the batches (j % drafters == index), summed over the
    drafter ranks."""

    def __init__(
        self,
        section: EvalSection,
        precision: PrecisionSection,
        *,
        anchors: int,
        batches: int,
        total_steps: int,
        index: int,
        group: dist.ProcessGroup,
        device: torch.device,
    ) -> None:
        """`anchors`: `optim.anchors` (training's compiled shapes); `batches`: the held-out batches of the
        run (`DataSplit.eval_batches`, the last one padded; 0 without held-out data)."""
        self.every, self.precision, self.anchors = section.every, precision, anchors
        self.batches, self.total_steps = batches, total_steps
        self.index, self.group, self.device = index, group, device

    def due(self, step_done: int) -> bool:
        return bool(self.batches) and evaluates_after(step_done, self.total_steps, self.every)

    def run(self, model: nn.Module, heldout_batch: Callable[[int], CapturedBatch]) -> HeldoutSums:
        mine = range(self.index, self.batches, dist.get_world_size(self.group))
        batches = (heldout_batch(j) for j in mine)
        sums = score_heldout(model, batches, self.precision, self.anchors, self.device)
        packed = sums.as_tensor(self.device)
        dist.all_reduce(packed, group=self.group)
        return HeldoutSums.from_tensor(packed)
