"""What a target rank hands a drafter rank: one batch of captured context.

This is the contract between `trainer/target_model/capture.py` (producer), `trainer/run/transport.py` (the wire) and
`trainer/model/drafter.py` (consumer). Shapes are static per run (sequences padded to `seq_len`), so
nothing downstream recompiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

PAD_ID = 0  # the id written into padding; never supervised, never attended as context before an anchor


@dataclass
class CapturedBatch:
    input_ids: torch.Tensor  # (B, S) int64: token ids, padded to the run's fixed length
    loss_mask: torch.Tensor  # (B, S) bool: True where the token may be supervised (response tokens)
    hidden: torch.Tensor  # (B, S, n_captured * H): the captured target layers, concatenated on features
    index: int = 0  # global batch number (for the deterministic batch -> drafter assignment and resume)
    # Held-out (eval) batches only: (B, S) int64, the target's own greedy next token after each position
    # (final norm + LM head), so the drafter can score what a greedy server would accept.
    target_ids: torch.Tensor | None = None

    @property
    def is_eval(self) -> bool:
        return self.target_ids is not None

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the batch holds."""
        held = [self.input_ids, self.loss_mask, self.hidden]
        return held if self.target_ids is None else [*held, self.target_ids]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> CapturedBatch:
        return CapturedBatch(
            self.input_ids.to(device, non_blocking=non_blocking),
            self.loss_mask.to(device, non_blocking=non_blocking),
            self.hidden.to(device, non_blocking=non_blocking),
            self.index,
            None if self.target_ids is None else self.target_ids.to(device, non_blocking=non_blocking),
        )


def real_token_count(input_ids: Any, loss_mask: Any) -> int:
    """Tokens of a (B, S) batch that are not right padding (`PAD_ID`, never supervised)."""
    return int(real_tokens(input_ids, loss_mask))


def real_tokens(input_ids: Any, loss_mask: Any) -> Any:
    """`real_token_count` as a 0-dim tensor on the batch's device: no host sync (the training loop
    counts every batch and reads the sums once per step)."""
    padding = (input_ids == PAD_ID) & ~loss_mask.bool()
    trailing = padding.flip(-1).long().cumprod(-1).sum()  # each row's run of padding at its end
    return input_ids.numel() - trailing
