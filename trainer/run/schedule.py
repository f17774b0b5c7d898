"""The run's schedule, the same on every rank: how many steps, which global batch each micro-step trains
on, when held-out evaluation runs, and in which order a target rank sends its batches."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dflash_base.errors import ConfigError

if TYPE_CHECKING:
    from trainer.runspec.config import TrainConfig
    from trainer.runspec.topology import Topology


@dataclass(frozen=True)
class RunPlan:
    """How many global batches and steps the run has; the same on every rank.

    A step is `accum` micro-steps; micro-step u gives drafter d the global batch u * drafters + d."""

    batches_per_epoch: int
    total_steps: int
    drafters: int
    accum: int = 1

    @property
    def total_micro_steps(self) -> int:
        return self.total_steps * self.accum


def plan_run(cfg: TrainConfig, sequences: int, drafters: int) -> RunPlan:
    """steps, or epochs over the (training) data rounded down to whole steps (each step takes `grad_accum`
    batches per drafter: `drafters` is the split's M, or the colocated rank count)."""
    o, m = cfg.optim, drafters
    per_epoch = sequences // o.batch_size
    if per_epoch == 0:
        raise ConfigError(
            f"optim.batch_size: must be <= the {sequences} sequences of the data, got {o.batch_size}"
        )
    steps = o.steps if o.steps is not None else int(per_epoch * float(o.epochs or 0)) // (m * o.grad_accum)
    if steps < 1:
        raise ConfigError(
            f"optim.epochs: too few for one step of {m * o.grad_accum} drafter batches, got {o.epochs}"
        )
    return RunPlan(per_epoch, steps, m, o.grad_accum)


def evaluates_after(step_done: int, total_steps: int, every: int) -> bool:
    """Held-out evaluation runs every `every` steps and after the last one (`every` 0: the last only)."""
    return step_done == total_steps or (every > 0 and step_done % every == 0)


def target_work(
    topology: Topology, target_rank: int, plan: RunPlan, resume_step: int, eval_every: int, eval_batches: int
) -> Iterator[tuple[str, int]]:
    """What the target of rank `target_rank` sends, in order: ("train", global batch i) for every i it makes
    (`Topology.producer_of`: i % N on one node; its own node's drafters' batches over several) from the
    resume point on, and after each evaluated step ("eval", j) for the held-out batches it makes.

    Each (target, drafter) channel is FIFO, so this order is what makes a drafter find a step's training
    batches before that step's held-out batches, and those before the next step's."""
    m, a = plan.drafters, plan.accum
    for step in range(resume_step, plan.total_steps):
        for index in range(step * a * m, (step + 1) * a * m):
            if topology.producer_of(index) == target_rank:
                yield "train", index
        if eval_batches and evaluates_after(step + 1, plan.total_steps, eval_every):
            for j in range(eval_batches):
                if topology.producer_of(j) == target_rank:
                    yield "eval", j
