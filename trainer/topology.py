"""Who is who in a run: the split (N target ranks stream to M drafter ranks) or colocated (every rank both).

Split: ranks [0, N) are targets, [N, N+M) drafters. Colocated: K ranks, each captures its own batches with
a frozen target and trains a drafter replica on them. Either way drafter d at step s trains on global
batch s*M + d (M = K when colocated), so colocated on K ranks sees the very batches a split with K
drafters sees, whichever rank produced them.

`resolve_topology` turns the config's `[topology]` and the process count torchrun started into a
`Topology`. The launcher (`dflash-doctor train`) resolves `mode = "auto"` from measured rates and passes
the decision to the workers as `--set` overrides; a bare `torchrun -m trainer` under `auto` runs a split
when `targets`/`drafters` are set and colocated otherwise. No torch here: the launcher imports this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dflash_doctor.errors import ConfigError

SPLIT = "split"
COLOCATED = "colocated"
AUTO = "auto"
MODES = (AUTO, SPLIT, COLOCATED)


@dataclass(frozen=True)
class Topology:
    """Split: targets are ranks [0, N), drafters ranks [N, N+M). Colocated: N = M = K, every rank both."""

    targets: int
    drafters: int
    colocated: bool = False

    def __post_init__(self) -> None:
        if self.targets < 1 or self.drafters < 1:
            raise ValueError(
                f"a topology needs at least one rank per role, got {self.targets}+{self.drafters}"
            )
        if self.colocated and self.targets != self.drafters:
            raise ValueError(
                f"colocated ranks are targets and drafters alike, got {self.targets}+{self.drafters}"
            )

    @classmethod
    def colocated_on(cls, ranks: int) -> Topology:
        return cls(ranks, ranks, colocated=True)

    @property
    def mode(self) -> str:
        return COLOCATED if self.colocated else SPLIT

    @property
    def world_size(self) -> int:
        return self.drafters if self.colocated else self.targets + self.drafters

    def is_target(self, rank: int) -> bool:
        return self.colocated or rank < self.targets

    def drafter_index(self, rank: int) -> int:
        return rank if self.colocated else rank - self.targets

    def drafter_rank(self, drafter_index: int) -> int:
        return drafter_index if self.colocated else self.targets + drafter_index

    @property
    def drafter_ranks(self) -> list[int]:
        return [self.drafter_rank(d) for d in range(self.drafters)]

    def producer_of(self, batch_index: int) -> int:
        """The target rank that makes global batch i."""
        return batch_index % self.targets

    def consumer_of(self, batch_index: int) -> int:
        """The drafter index that trains on global batch i."""
        return batch_index % self.drafters

    def batch_for(self, step: int, drafter_index: int) -> int:
        return step * self.drafters + drafter_index

    def describe(self) -> str:
        if self.colocated:
            return f"{self.drafters} colocated rank{'s' if self.drafters > 1 else ''} (target + drafter each)"
        return f"{self.targets} target + {self.drafters} drafter ranks"

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "targets": self.targets, "drafters": self.drafters}


def forces_split(section: Any) -> bool:
    """`topology.targets` or `topology.drafters` set: the config asks for that split, whatever the mode."""
    return section.targets is not None or section.drafters is not None


def split_of(section: Any) -> Topology:
    """The config's split; an unset side is one rank."""
    return Topology(section.targets or 1, section.drafters or 1)


def resolve_topology(section: Any, world_size: int | None = None) -> Topology:
    """The topology a trainer process runs, from `[topology]` and (under torchrun) the process count.

    `world_size` None: not started yet (`python -m trainer` decides how many processes to start).
    Raises ConfigError when torchrun started a number of processes the topology cannot use.
    """
    mode = section.mode
    if mode == SPLIT or (mode == AUTO and forces_split(section)):
        topology = split_of(section)
        if world_size is not None and world_size != topology.world_size:
            raise ConfigError(
                f"topology: {topology.describe()} = {topology.world_size} processes, but torchrun started "
                f"{world_size} (use --nproc-per-node {topology.world_size})"
            )
        return topology
    ranks = section.ranks or world_size or 1
    if world_size is not None and world_size != ranks:
        raise ConfigError(
            f"topology.ranks: {ranks} colocated ranks, but torchrun started {world_size} processes "
            f"(use --nproc-per-node {ranks}, or remove topology.ranks)"
        )
    return Topology.colocated_on(ranks)
