"""Who is who in a run: the split (N target ranks stream to M drafter ranks) or colocated (every rank both).

Split on one node: ranks [0, N) are targets, [N, N+M) drafters. Colocated: K ranks, each captures its own
batches with a frozen target and trains a drafter replica on them. Either way drafter d at step s trains on
global batch s*M + d (M = K when colocated), so colocated on K ranks sees the very batches a split with K
drafters sees, whichever rank produced them.

Several nodes (`placement`): by default each node runs its own targets and drafters (`topology.targets` +
`topology.drafters` on every node; torchrun numbers a node's ranks together, so node k holds ranks
[k*L, (k+1)*L) of L each: its first n are targets, the other m drafters), and a batch for a drafter of node k
is made by a target of node k: the captured hidden states (hundreds of MB a sequence at the story's shapes)
never cross the network; only the drafters' gradient all-reduce does. `topology.placement = "world"` keeps one
list for the whole run (ranks [0, N) targets, [N, N+M) drafters, the counts the whole run's): for nodes too
small to hold both roles, and then most batches cross nodes (`crossing_pairs` says which).

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
# topology.placement: where a split's roles sit over several nodes. "node": every node runs targets + drafters
# (the config's split is one node's) and a target feeds only its own node's drafters; "world": one list over
# every node, ranks [0, N) targets and [N, N+M) drafters of the whole run, batches crossing nodes
NODE = "node"
WORLD = "world"
PLACEMENTS = (NODE, WORLD)


def overlap_mode(setting: str, on_cuda: bool) -> str:
    """What `topology.overlap_capture` means on this device: `auto` is "step" on CUDA (measured faster at
    qwen3-8b-b16 on an H200, +2.2% and +3.1% in two sessions, the same losses) and "off" elsewhere; a CPU
    captures synchronously whatever is set (it has no second stream)."""
    if not on_cuda:
        return "off"
    return "step" if setting == "auto" else setting


@dataclass(frozen=True)
class Topology:
    """Split: `targets` + `drafters` ranks in all (the whole run's counts), over `nodes` nodes; per node
    (`per_node`, the default) each node holds targets/nodes + drafters/nodes and feeds only its own drafters,
    else ranks [0, N) are targets and [N, N+M) drafters. Colocated: N = M = K, every rank both."""

    targets: int
    drafters: int
    colocated: bool = False
    nodes: int = 1
    per_node: bool = True

    def __post_init__(self) -> None:
        if self.targets < 1 or self.drafters < 1:
            raise ValueError(
                f"a topology needs at least one rank per role, got {self.targets}+{self.drafters}"
            )
        if self.colocated and self.targets != self.drafters:
            raise ValueError(
                f"colocated ranks are targets and drafters alike, got {self.targets}+{self.drafters}"
            )
        if self.nodes < 1:
            raise ValueError(f"a topology needs at least one node, got {self.nodes}")
        if self.node_local and (self.targets % self.nodes or self.drafters % self.nodes):
            raise ValueError(
                f"{self.targets}+{self.drafters} do not split into the same targets and drafters on each of "
                f"{self.nodes} nodes"
            )

    @classmethod
    def colocated_on(cls, ranks: int, nodes: int = 1) -> Topology:
        return cls(ranks, ranks, colocated=True, nodes=nodes)

    @classmethod
    def split_per_node(cls, targets: int, drafters: int, nodes: int = 1) -> Topology:
        """`targets` + `drafters` on each of `nodes` nodes, each node feeding its own drafters."""
        return cls(targets * nodes, drafters * nodes, nodes=nodes)

    @property
    def mode(self) -> str:
        return COLOCATED if self.colocated else SPLIT

    @property
    def placement(self) -> str:
        return NODE if self.per_node else WORLD

    @property
    def world_size(self) -> int:
        return self.drafters if self.colocated else self.targets + self.drafters

    @property
    def node_local(self) -> bool:
        """A split whose every node holds both roles (one node: always)."""
        return not self.colocated and self.per_node

    @property
    def ranks_per_node(self) -> int:
        """torchrun's --nproc-per-node (the whole world when the nodes cannot hold equal shares)."""
        return self.world_size // self.nodes if self.world_size % self.nodes == 0 else self.world_size

    @property
    def local_targets(self) -> int:
        """Targets on each node (per-node placement) or in all."""
        return self.targets // self.nodes if self.node_local else self.targets

    @property
    def local_drafters(self) -> int:
        return self.drafters // self.nodes if self.node_local else self.drafters

    def node_of(self, rank: int) -> int:
        """The node torchrun starts `rank` on: it numbers each node's ranks together, node by node."""
        return rank // self.ranks_per_node

    def is_target(self, rank: int) -> bool:
        if self.colocated:
            return True
        if self.node_local:
            return rank % self.ranks_per_node < self.local_targets
        return rank < self.targets

    def target_rank(self, target_index: int) -> int:
        """The rank of target t (targets are numbered node by node)."""
        if self.colocated or not self.node_local:
            return target_index
        node, local = divmod(target_index, self.local_targets)
        return node * self.ranks_per_node + local

    def drafter_index(self, rank: int) -> int:
        if self.colocated:
            return rank
        if self.node_local:
            node, local = divmod(rank, self.ranks_per_node)
            return node * self.local_drafters + local - self.local_targets
        return rank - self.targets

    def drafter_rank(self, drafter_index: int) -> int:
        if self.colocated:
            return drafter_index
        if self.node_local:
            node, local = divmod(drafter_index, self.local_drafters)
            return node * self.ranks_per_node + self.local_targets + local
        return self.targets + drafter_index

    @property
    def drafter_ranks(self) -> list[int]:
        return [self.drafter_rank(d) for d in range(self.drafters)]

    def producer_of(self, batch_index: int) -> int:
        """The rank of the target that makes global batch i (of training, or of held-out batches).

        One list: target i % N. Per node: the batch's drafter d = i % M sits on node k = d // m; node k's
        batches, counted in order (u = (i // M) * m + d % m), go round its n targets (u % n). One node: i % N."""
        if self.colocated:
            return self.drafter_rank(self.consumer_of(batch_index))
        if not self.node_local:
            return batch_index % self.targets
        n, m = self.local_targets, self.local_drafters
        node, local = divmod(self.consumer_of(batch_index), m)
        counted = (batch_index // self.drafters) * m + local
        return self.target_rank(node * n + counted % n)

    def consumer_of(self, batch_index: int) -> int:
        """The drafter index that trains on global batch i."""
        return batch_index % self.drafters

    def batch_for(self, step: int, drafter_index: int) -> int:
        return step * self.drafters + drafter_index

    def pairs(self) -> list[tuple[int, int]]:
        """Every (target rank, drafter rank) that batches flow between (colocated: each rank with itself).
        The routing repeats every N x M batches, so those are all it takes to find them."""
        if self.colocated:
            return [(r, r) for r in range(self.world_size)]
        flows = {
            (self.producer_of(i), self.drafter_rank(self.consumer_of(i)))
            for i in range(self.targets * self.drafters)
        }
        return sorted(flows)

    def crossing_pairs(self) -> list[tuple[int, int]]:
        """The pairs whose target and drafter sit on different nodes (their hidden states cross the network)."""
        return [(t, d) for t, d in self.pairs() if self.node_of(t) != self.node_of(d)]

    def drafters_fed_by(self, target_rank: int) -> list[int]:
        return [d for t, d in self.pairs() if t == target_rank]

    def targets_feeding(self, drafter_rank: int) -> list[int]:
        return [t for t, d in self.pairs() if d == drafter_rank]

    def describe(self) -> str:
        if self.colocated:
            return f"{self.drafters} colocated rank{'s' if self.drafters > 1 else ''} (target + drafter each)"
        shape = f"{self.targets} target + {self.drafters} drafter ranks"
        if self.nodes > 1 and self.node_local:
            return f"{shape} ({self.local_targets} + {self.local_drafters} on each of {self.nodes} nodes)"
        if self.nodes > 1:
            return f"{shape} (one list over {self.nodes} nodes)"
        return shape

    def pairs_json(self) -> list[dict[str, int]]:
        return [
            {
                "target_rank": t,
                "drafter_rank": d,
                "target_node": self.node_of(t),
                "drafter_node": self.node_of(d),
            }
            for t, d in self.pairs()
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "targets": self.targets,
            "drafters": self.drafters,
            "nodes": self.nodes,
            "placement": self.placement,
            "pairs": self.pairs_json(),
        }

    def crossing_reason(self) -> str | None:
        """Why batches cross nodes, or None when none does."""
        crossing = self.crossing_pairs()
        if not crossing:
            return None
        return (
            f"{len(crossing)} of {len(self.pairs())} target -> drafter pairs cross nodes: "
            f'topology.placement = "world" puts ranks [0, {self.targets}) as targets and '
            f"[{self.targets}, {self.world_size}) as drafters over {self.nodes} nodes, so every batch between "
            "them moves its hidden states over the network"
        )


def forces_split(section: TopologySection) -> bool:
    """`topology.targets` or `topology.drafters` set: the config asks for that split, whatever the mode."""
    return section.targets is not None or section.drafters is not None


def split_of(section: TopologySection, nodes: int = 1) -> Topology:
    """The config's split over `nodes` nodes; an unset side is one rank. `placement = "node"`: the counts are
    one node's, the same on every node; `"world"`: the whole run's."""
    targets, drafters = section.targets or 1, section.drafters or 1
    if section.placement == WORLD:
        return Topology(targets, drafters, nodes=nodes, per_node=False)
    return Topology.split_per_node(targets, drafters, nodes)


# The fix when the nodes of one run resolved different topologies.
PIN_ON_EVERY_NODE = (
    'set the topology explicitly and identically on every node (--set topology.mode="colocated" '
    '--set topology.ranks=K, or --set topology.mode="split" --set topology.targets=N '
    "--set topology.drafters=M), or free the GPU memory the gate named on the node that chose "
    'differently (topology.mode = "auto" decides on each node\'s own GPUs)'
)


def configured_topology(section: TopologySection, ranks: int, nodes: int = 1) -> tuple[Topology, str] | None:
    """The topology `[topology]` names on `ranks` devices of `nodes` nodes, and why; None when it leaves the
    choice open (`auto` without targets/drafters). The one place that reads the mode: the trainer's
    `resolve_topology` and the launcher's `decide` both start here, so they cannot disagree on what a config
    asks for."""
    each = " on each node" if nodes > 1 and section.placement == NODE else ""
    if forces_split(section):
        return split_of(section, nodes), f"topology.targets/drafters set: the configured split{each}"
    if section.mode == SPLIT:
        return split_of(section, nodes), f'topology.mode = "split"{each}'
    if section.mode == COLOCATED:
        return Topology.colocated_on(ranks, nodes), 'topology.mode = "colocated"'
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
    configured = configured_topology(section, ranks, nodes)
    topology = configured[0] if configured else Topology.colocated_on(ranks, nodes)  # auto, undecided
    if not topology.colocated:
        if world_size is not None and world_size != topology.world_size:
            raise ConfigError(
                f"topology: {topology.describe()} = {topology.world_size} processes, but torchrun started "
                f"{world_size} (use --nproc-per-node {topology.ranks_per_node})",
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
    per_node: bool = True  # a split's placement over several nodes (Topology.per_node)

    WIDTH = 8  # len(to_row())

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
            topology.per_node,
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
            int(self.per_node),
        ]

    @classmethod
    def from_row(cls, row: list[int]) -> RunDigest:
        node, rank, colocated, targets, drafters, world_size, config_hash, per_node = (int(v) for v in row)
        return cls(node, rank, bool(colocated), targets, drafters, world_size, config_hash, bool(per_node))

    @property
    def run(self) -> tuple[bool, bool, int, int, int, int]:
        """What must be equal on every rank (not who it is); the topology first, the config's hash last."""
        per_node = self.per_node or self.colocated  # colocated has no placement to differ in
        return (self.colocated, per_node, self.targets, self.drafters, self.world_size, self.config_hash)

    def describe(self) -> str:
        """`colocated on 2 ranks, config 58500e11` / `split 1+1, config 58500e11`."""
        if self.colocated:
            shape = f"colocated on {self.drafters} rank{'s' if self.drafters > 1 else ''}"
        else:
            shape = f"split {self.targets}+{self.drafters}" + ("" if self.per_node else " over the world")
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
    if len({d.run[:5] for d in digests}) > 1:
        raise ConfigError(
            "the nodes of this run disagree on the topology: " + "; ".join(parts), hint=PIN_ON_EVERY_NODE
        )
    raise ConfigError(
        "the nodes of this run disagree on the graph config (drafter, shapes, dtype, steps): "
        + "; ".join(parts),
        hint="give every node the same config file and the same --set overrides",
    )


def check_placement(digests: list[RunDigest], topology: Topology) -> None:
    """Every rank runs on the node the topology placed it on (torchrun numbers each node's ranks together,
    node by node, when every node starts the same count): else a target would feed a drafter elsewhere
    while the plan said it would not. ConfigError naming the first rank out of place."""
    for d in digests:
        if d.node != topology.node_of(d.rank):
            raise ConfigError(
                f"rank {d.rank} runs on node {d.node}, but {topology.describe()} places it on node "
                f"{topology.node_of(d.rank)}: the nodes started different process counts",
                hint=f"start {topology.ranks_per_node} processes on every node (--nproc-per-node)",
            )
