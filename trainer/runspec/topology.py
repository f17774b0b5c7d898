"""Who is who in a run: the split (N target ranks stream to M drafter ranks) or colocated (every rank both).

Split: ranks [0, N) are targets, [N, N+M) drafters. Colocated: K ranks, each captures its own batches with
a frozen target and trains a drafter replica on them. Either way drafter d at step s trains on global
batch s*M + d (M = K when colocated), so colocated on K ranks sees the very batches a split with K
drafters sees, whichever rank produced them.

`resolve_topology` turns the config's `[topology]` and the process count torchrun started into a
`Topology`. The launcher (`dflash-doctor train`) resolves `mode = "auto"` from measured rates and passes
the decision to the workers as `--set` overrides; a bare `torchrun -m trainer` under `auto` runs a split
when `targets`/`drafters` are set and colocated otherwise. No torch here: the launcher imports this.

Each node's launcher decides on its own inputs, so the nodes of one run can disagree; `RunDigest` is what
every rank tells the others right after the process group forms (`trainer.run.train.main`: one all_gather),
and `disagreement` turns differing digests into one message naming what each node runs and the fix.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dflash_base.errors import ConfigError

if TYPE_CHECKING:  # config.py imports this module: the types only
    from trainer.runspec.config import TopologySection, TrainConfig

SPLIT = "split"
COLOCATED = "colocated"
AUTO = "auto"
MODES = (AUTO, SPLIT, COLOCATED)
# topology.overlap_capture: when a colocated rank's next capture may run (trainer/run/pipeline.py)
OVERLAP_MODES = ("auto", "off", "step", "optimizer")
# topology.launcher: how `dflash-doctor train` starts the ranks. "auto": a launch of one process in all starts
# `python -m trainer` itself, without torchrun (its agent and rendezvous cost 1.8 s on an H200 and add
# nothing for one rank); "torchrun": always torchrun (dflash_doctor/launch/direct.py)
LAUNCHERS = ("auto", "torchrun")


def overlap_mode(setting: str, on_cuda: bool) -> str:
    """What `topology.overlap_capture` means on this device: `auto` is "step" on CUDA (measured faster at
    qwen3-8b-b16 on an H200, +2.2% and +3.1% in two sessions, the same losses) and "off" elsewhere; a CPU
    captures synchronously whatever is set (it has no second stream)."""
    if not on_cuda:
        return "off"
    return "step" if setting == "auto" else setting


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


def forces_split(section: TopologySection) -> bool:
    """`topology.targets` or `topology.drafters` set: the config asks for that split, whatever the mode."""
    return section.targets is not None or section.drafters is not None


def split_of(section: TopologySection) -> Topology:
    """The config's split; an unset side is one rank."""
    return Topology(section.targets or 1, section.drafters or 1)


# The fix when the nodes of one run resolved different topologies.
PIN_ON_EVERY_NODE = (
    'set the topology explicitly and identically on every node (--set topology.mode="colocated" '
    '--set topology.ranks=K, or --set topology.mode="split" --set topology.targets=N '
    "--set topology.drafters=M), or free the GPU memory the gate named on the node that chose "
    'differently (topology.mode = "auto" decides on each node\'s own GPUs)'
)


def configured_topology(section: TopologySection, ranks: int) -> tuple[Topology, str] | None:
    """The topology `[topology]` names on `ranks` devices, and why; None when it leaves the choice open
    (`auto` without targets/drafters). The one place that reads the mode: the trainer's `resolve_topology`
    and the launcher's `decide` both start here, so they cannot disagree on what a config asks for."""
    if forces_split(section):
        return split_of(section), "topology.targets/drafters set: the configured split"
    if section.mode == SPLIT:
        return split_of(section), 'topology.mode = "split"'
    if section.mode == COLOCATED:
        return Topology.colocated_on(ranks), 'topology.mode = "colocated"'
    return None


def resolve_topology(section: TopologySection, world_size: int | None = None, nodes: int = 1) -> Topology:
    """The topology a trainer process runs, from `[topology]` and (under torchrun) the process count.

    `world_size` None: not started yet (`python -m trainer` decides how many processes to start).
    Raises ConfigError when torchrun started a number of processes the topology cannot use; over several
    `nodes` that usually means the nodes' launchers chose different topologies, and the hint says so.
    """
    hint = (
        f"with {nodes} nodes, they likely chose different topologies: {PIN_ON_EVERY_NODE}"
        if nodes > 1
        else None
    )
    ranks = section.ranks or world_size or 1
    configured = configured_topology(section, ranks)
    topology = configured[0] if configured else Topology.colocated_on(ranks)  # auto, undecided: colocated
    if not topology.colocated:
        if world_size is not None and world_size != topology.world_size:
            raise ConfigError(
                f"topology: {topology.describe()} = {topology.world_size} processes, but torchrun started "
                f"{world_size} (use --nproc-per-node {topology.world_size})",
                hint=hint,
            )
        return topology
    if world_size is not None and world_size != ranks:
        raise ConfigError(
            f"topology.ranks: {ranks} colocated ranks, but torchrun started {world_size} "
            f"process{'es' if world_size != 1 else ''} "
            f"(use --nproc-per-node {ranks}, or remove topology.ranks)",
            hint=hint,
        )
    return topology


# ---------------------------------------------------------------- every node runs the same run

# The config fields that shape the compiled graphs and the collectives: two nodes that differ in any of
# them would hang or fail confusingly. Not the paths or output folder, which may differ per node's disk.
GRAPH_FIELDS = (
    "target.dtype",
    "target.compile_layers",
    "drafter",
    "data.seq_len",
    "optim.batch_size",
    "optim.grad_accum",
    "optim.anchors",
    "optim.steps",
    "optim.epochs",
    "precision.autocast",
    "topology.in_flight",
)


def graph_config_hash(cfg: TrainConfig) -> int:
    """A 63-bit hash of `cfg`'s GRAPH_FIELDS (fits a signed int64 tensor element)."""
    values = {}
    for name in GRAPH_FIELDS:
        value = cfg
        for part in name.split("."):
            value = getattr(value, part)
        values[name] = value
    text = json.dumps(values, sort_keys=True, default=lambda o: getattr(o, "__dict__", repr(o)))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


@dataclass(frozen=True)
class RunDigest:
    """What one rank runs, as a fixed row of int64s: its node, the resolved topology and the config hash."""

    node: int
    rank: int
    colocated: bool
    targets: int
    drafters: int
    world_size: int
    config_hash: int

    WIDTH = 7  # len(to_row())

    @classmethod
    def of(cls, cfg: TrainConfig, topology: Topology, node: int, rank: int) -> RunDigest:
        return cls(
            node,
            rank,
            topology.colocated,
            topology.targets,
            topology.drafters,
            topology.world_size,
            graph_config_hash(cfg),
        )

    def to_row(self) -> list[int]:
        return [
            self.node,
            self.rank,
            int(self.colocated),
            self.targets,
            self.drafters,
            self.world_size,
            self.config_hash,
        ]

    @classmethod
    def from_row(cls, row: list[int]) -> RunDigest:
        node, rank, colocated, targets, drafters, world_size, config_hash = (int(v) for v in row)
        return cls(node, rank, bool(colocated), targets, drafters, world_size, config_hash)

    @property
    def run(self) -> tuple[bool, int, int, int, int]:
        """What must be equal on every rank (not who it is)."""
        return (self.colocated, self.targets, self.drafters, self.world_size, self.config_hash)

    def describe(self) -> str:
        """`colocated on 2 ranks, config 58500e11` / `split 1+1, config 58500e11`."""
        if self.colocated:
            shape = f"colocated on {self.drafters} rank{'s' if self.drafters > 1 else ''}"
        else:
            shape = f"split {self.targets}+{self.drafters}"
        return f"{shape}, config {self.config_hash >> 31:08x}"  # the hash's top 32 of 63 bits


def check_agreement(digests: list[RunDigest]) -> None:
    """Quiet when every rank runs the same; else ConfigError naming what each node (or rank) runs, and the fix."""
    if len({d.run for d in digests}) <= 1:
        return
    by_node: dict[int, list[RunDigest]] = {}
    for d in digests:
        by_node.setdefault(d.node, []).append(d)
    parts = []
    for node, members in sorted(by_node.items()):
        for run in dict.fromkeys(d.run for d in members):  # a node's own ranks should agree too
            ranks = [d.rank for d in members if d.run == run]
            who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {min(ranks)}-{max(ranks)}"
            first = next(d for d in members if d.run == run)
            parts.append(f"node {node} ({who}): {first.describe()}")
    if len({d.run[:4] for d in digests}) > 1:
        raise ConfigError(
            "the nodes of this run disagree on the topology: " + "; ".join(parts), hint=PIN_ON_EVERY_NODE
        )
    raise ConfigError(
        "the nodes of this run disagree on the graph config (drafter, shapes, dtype, steps): "
        + "; ".join(parts),
        hint="give every node the same config file and the same --set overrides",
    )
