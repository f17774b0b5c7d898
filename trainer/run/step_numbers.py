"""One step's numbers, from the drafter ranks' devices to the first drafter's log, one step late.

A step's sums (loss, per-position accuracy counts, acceptance, tokens, the grad norm) are packed into one
tensor, all-reduced over the drafter ranks and copied to pinned host memory without blocking
(`StepNumbers`); the loop reads them once the next step's work is queued (`QueuedStep`), so the host never
drains the GPU per step. `step_metrics` turns them into the JSONL line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from trainer.model.loss import LossOutput, expected_acceptance_length
from trainer.run.heldout import HeldoutSums
from trainer.run.metrics import StepMetrics

# After the loss and the two per-position rows (correct, counted): the scalars, in this order.
TAIL = ("accept_len_sum", "anchors", "sequences", "real_tokens", "supervised_tokens", "grad_norm")


class FedTokens(Protocol):
    """What a step's micro-batches held (trainer.run.train.MicroBatches): counted on the device."""

    sequences: int
    real_tokens: torch.Tensor | int
    supervised_tokens: torch.Tensor | int


class StepNumbers:
    """A step's device-side numbers on their way to the host: the copy is queued, `read()` waits for it
    alone (not for work queued after it)."""

    def __init__(self, values: torch.Tensor) -> None:
        self.event: torch.cuda.Event | None = None
        if values.device.type == "cuda":
            self.host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self.host.copy_(values, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = values.detach().clone()

    def read(self) -> torch.Tensor:
        if self.event is not None:
            self.event.synchronize()
        return self.host


@dataclass
class StepStats:
    """One step's numbers summed over its micro-batches and the drafter ranks."""

    loss: float  # mean of the micro-batches' losses over the ranks
    correct: torch.Tensor
    counted: torch.Tensor
    accept_len_sum: float
    anchors: float
    sequences: float
    real_tokens: float
    supervised_tokens: float


@dataclass(frozen=True)
class QueuedStep:
    """A step whose work is queued and whose numbers are on their way to the host."""

    step: int  # steps done, counting this one
    numbers: StepNumbers
    block: int  # block size: how many per-position accuracy counts the numbers hold
    lr: float
    waited: float
    since: Any  # timer mark: the previous step's end (or this step's start)
    ended: Any  # timer mark: this step's work queued
    window: str = "pipelined"  # what the window held (trainer.run.steady.window_kind)


def pack_step(
    outs: list[LossOutput], feed: FedTokens, grad_norm: torch.Tensor, group: dist.ProcessGroup
) -> torch.Tensor:
    """One step's numbers in one tensor, summed over the drafter ranks (queued, not read): mean loss,
    per-position correct and counted, then the `TAIL` scalars: acceptance sum, anchors, sequences, real and
    supervised tokens, and this rank's grad norm (the same on every rank after DDP's gradient all-reduce)."""
    loss = outs[0].loss

    def on_device(value: torch.Tensor | int) -> torch.Tensor:  # new_full: a fill, not a host copy
        return value.float() if isinstance(value, torch.Tensor) else loss.new_full((), float(value))

    counts = torch.stack(
        [on_device(feed.sequences), on_device(feed.real_tokens), on_device(feed.supervised_tokens)]
    ).float()
    packed = torch.cat(
        [
            torch.stack([o.loss.detach().float() for o in outs]).mean().view(1),
            torch.stack([o.correct.float() for o in outs]).sum(0),
            torch.stack([o.counted.float() for o in outs]).sum(0),
            torch.stack([o.accept_len_sum.float() for o in outs]).sum().view(1),
            torch.stack([o.anchors.float() for o in outs]).sum().view(1),
            counts,
        ]
    )
    dist.all_reduce(packed, group=group)
    return torch.cat([packed, grad_norm.detach().float().view(1).to(packed.device)])


def unpack_step(packed: torch.Tensor, block: int, world: int) -> tuple[StepStats, float]:
    """`pack_step`'s tensor, on the host, back into StepStats and the grad norm."""
    tail = dict(zip(TAIL, packed[-len(TAIL) :].tolist(), strict=True))
    stats = StepStats(
        float(packed[0]) / world,
        packed[1 : 1 + block],
        packed[1 + block : 1 + 2 * block],
        tail["accept_len_sum"],
        tail["anchors"],
        tail["sequences"],
        tail["real_tokens"],
        tail["supervised_tokens"],
    )
    return stats, tail["grad_norm"]


def step_metrics(
    step: int,
    s: StepStats,
    lr: float,
    grad_norm: float,
    elapsed: float,
    waited: float,
    heldout: HeldoutSums | None,
    heldout_s: float,
    window: str = "pipelined",
    machine: dict[str, Any] | None = None,
) -> StepMetrics:
    accuracy = (s.correct / s.counted.clamp(min=1)).tolist()
    return StepMetrics(
        step=step,
        loss=s.loss,
        lr=lr,
        grad_norm=grad_norm,
        accuracy=[round(a, 5) for a in accuracy],
        accept_len=s.accept_len_sum / max(s.anchors, 1.0),
        accept_len_from_accuracy=expected_acceptance_length(s.correct, s.counted),
        tok_s=s.real_tokens / elapsed,
        supervised_tok_s=s.supervised_tokens / elapsed,
        samples_s=s.sequences / elapsed,
        step_time_s=elapsed,
        data_wait_s=waited,
        heldout_accept_len=heldout.accept_len_target if heldout else None,
        heldout_accept_len_labels=heldout.accept_len_labels if heldout else None,
        heldout_accept_len_last_answer=heldout.accept_len_last_answer if heldout else None,
        heldout_s=heldout_s if heldout else None,
        heldout_sequences=heldout.sequences if heldout else None,
        tokens=s.real_tokens,
        window=window,
        machine=machine,
    )
