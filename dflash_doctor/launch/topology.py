"""Which topology a launch runs: the split, colocated, or (`topology.mode = "auto"`) the faster that fits.

For the GPUs the launch will use (every GPU of every node, or `topology.ranks`), `auto` compares
colocated on all of them with the best N+M split, projected from the per-role rates measured at the
config's shapes (`split.py`, `dflash_doctor/data/role_rates.json`), and keeps only what fits the smallest
free GPU memory (`memory_plan.py`). `topology.targets`/`topology.drafters` still force their split.
Over several nodes the split is one node's, the same on every node (placement by node: hidden states never
leave a node; `topology.placement = "world"` splits all GPUs as one list).
The decision goes to the workers as `--set` overrides, so they never guess.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dflash_doctor.launch.memory_plan import (
    GIB,
    PlanInputs,
    colocated_estimate,
    drafter_estimate,
    drafter_params,
    target_estimate,
)
from dflash_doctor.launch.split import (
    ColocatedOption,
    GradientSync,
    RoleRates,
    SplitOption,
    load_role_rates,
    project_colocated,
    rates_for_config,
    recommend_split,
)
from trainer.runspec.topology import AUTO, COLOCATED, NODE, SPLIT, Topology, configured_topology

if TYPE_CHECKING:  # types only: the gate imports the config loader lazily (gate.load_training_config)
    from trainer.runspec.config import TopologySection, TrainConfig


@dataclass(frozen=True)
class MemoryFit:
    """Per-GPU peaks of both designs against the smallest free memory of the GPUs used (None: unknown)."""

    colocated_bytes: int
    split_bytes: int  # the larger of a target rank's and a drafter rank's
    free_bytes: int | None

    @property
    def colocated_fits(self) -> bool:
        return self.free_bytes is None or self.colocated_bytes <= self.free_bytes

    @property
    def split_fits(self) -> bool:
        return self.free_bytes is None or self.split_bytes <= self.free_bytes


def memory_fit(inputs: PlanInputs, free_bytes: int | None) -> MemoryFit:
    split = max(target_estimate(inputs).total, drafter_estimate(inputs).total)
    return MemoryFit(colocated_estimate(inputs).total, split, free_bytes)


@dataclass(frozen=True)
class TopologyChoice:
    """The topology this launch runs, why, and both designs' projections side by side."""

    topology: Topology
    requested: str  # the config's topology.mode
    reason: str
    gpus: int  # the ranks the choice was made for (GPUs, or CPU processes)
    fit: MemoryFit
    colocated: ColocatedOption | None = None  # projected on `gpus`, when rates exist at these shapes
    split: SplitOption | None = None  # the best N+M of `gpus`, when rates exist and gpus >= 2
    rates_source: str = ""
    unit: str = "GPU"  # what `gpus` counts: "GPU", or "process" on CPU
    nodes: int = 1  # --nnodes: each node's launcher decides alone
    node_local: bool = False  # auto: this node's free memory changed the pick (other nodes may differ)
    sync: GradientSync | None = None  # the drafters' gradient all-reduce, counted in both projections
    by_node: bool = False  # the split is one node's, on each of `nodes` (placement by node, several nodes)

    def _count(self, count: int | None = None) -> str:
        """'1 GPU', '2 GPUs', '2 processes': `count` (default: the ranks chosen for) of this unit."""
        count = self.gpus if count is None else count
        plural = "processes" if self.unit == "process" else f"{self.unit}s"
        return f"{count} {self.unit if count == 1 else plural}"

    @property
    def pin(self) -> str:
        """The `--set` flags that make every node run this topology, whatever its own inputs."""
        return " ".join(f"--set {shlex.quote(item)}" for item in self.overrides)

    def nodes_line(self) -> str | None:
        """With several nodes under `auto`: what the decision rested on, and how to pin it on every node."""
        if self.nodes < 2 or self.requested != AUTO:
            return None
        if self.node_local:
            free = self.fit.free_bytes / GIB if self.fit.free_bytes is not None else 0.0
            basis = (
                f"this node's free GPU memory ({free:.1f} GiB) decided it, so a node with more may pick "
                "otherwise (its workers would then stop at once, naming each node's choice)"
            )
        else:
            basis = "from what every node shares (GPU count, role rates); this node's free memory did not change it"
        return (
            f"  {self.nodes} nodes, each launcher deciding alone: {basis}; pin it on every node: {self.pin}"
        )

    @property
    def overrides(self) -> list[str]:
        """`--set` items that make the workers run exactly this topology (a split by node: one node's)."""
        t = self.topology
        if t.colocated:
            return [f'topology.mode="{COLOCATED}"', f"topology.ranks={t.world_size}"]
        return [
            f'topology.mode="{SPLIT}"',
            f"topology.targets={t.local_targets}",
            f"topology.drafters={t.local_drafters}",
        ]

    def _split_text(self, split: SplitOption) -> str:
        """`3+5 (109.7 Ktok/s, drafter-bound)`; by node `5+3 on each node (10+6, 244.0 Ktok/s, ...)`."""
        if not self.by_node:
            return str(split)
        k = self.nodes
        return f"{split.targets // k}+{split.drafters // k} on each node ({split})"

    def split_that_fits(self) -> str | None:
        """For a refused colocated launch: the split that would fit, as config lines; None if none would."""
        if not self.fit.split_fits:
            return None
        if self.gpus < 2:
            return (
                f"a split (1 target + 1 drafter, {self.fit.split_bytes / GIB:.1f} GiB per GPU) fits on 2 such GPUs: "
                'topology.mode = "split"'
            )
        k = self.nodes if self.by_node else 1
        targets, drafters = (
            (self.split.targets // k, self.split.drafters // k) if self.split else (1, self.gpus // k - 1)
        )
        return (
            f'the split fits ({self.fit.split_bytes / GIB:.1f} GiB per GPU): topology.mode = "split", '
            f"topology.targets = {targets}, topology.drafters = {drafters}"
        )

    def lines(self) -> list[str]:
        """What `train --dry-run` prints: the choice and why, then both designs side by side."""
        free = f" of {self.fit.free_bytes / GIB:.1f} GiB free" if self.fit.free_bytes is not None else ""

        def memory(need: int, fits: bool) -> str:
            return f"{need / GIB:.1f} GiB per {self.unit}{free}{'' if fits else ', does not fit'}"

        if self.colocated is not None:
            how = "measured rate" if self.colocated.measured else "projected from the role rates"
            colocated = f"{self.colocated.tok_s / 1000:,.1f} Ktok/s ({how})"
        else:
            colocated = "no rates at these shapes"
        if self.split is not None:
            split = self._split_text(self.split)
        else:
            split = f"needs {self._count(2)}" if self.gpus < 2 else "no rates at these shapes"
        out = [
            f"topology: {self.topology.describe()}: {self.reason}",
            f"  colocated on {self._count()}: {colocated}; {memory(self.fit.colocated_bytes, self.fit.colocated_fits)}",
            f"  best split of {self._count()}: {split}; {memory(self.fit.split_bytes, self.fit.split_fits)}",
        ]
        if self.rates_source:
            out.append(f"  rates: {self.rates_source}")
        if self.sync is not None and (self.colocated is not None or self.split is not None):
            out.append(f"  {self.sync.describe(self.topology.drafters)} (in both projections)")
        out.append(f"  {pairs_line(self.topology)}")
        nodes = self.nodes_line()
        if nodes:
            out.append(nodes)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            **self.topology.to_json(),
            "requested": self.requested,
            "reason": self.reason,
            "gpus": self.gpus,
            "colocated_bytes": self.fit.colocated_bytes,
            "split_bytes": self.fit.split_bytes,
            "free_bytes": self.fit.free_bytes,
            "colocated": self.colocated.to_json() if self.colocated else None,
            "split": (
                {
                    "targets": self.split.targets,
                    "drafters": self.split.drafters,
                    "tok_s": round(self.split.tok_s, 1),
                }
                if self.split
                else None
            ),
            "rates_source": self.rates_source,
            "gradient_sync": (
                {
                    "gradient_bytes": self.sync.gradient_bytes,
                    "sequences_per_step": self.sync.sequences_per_step,
                    "bus_bytes_s": self.sync.bus_bytes_s,
                    "seconds_per_step": round(self.sync.seconds(self.topology.drafters), 6),
                }
                if self.sync
                else None
            ),
            "nodes": self.nodes,
            "node_local": self.node_local,
            "crossing": self.topology.crossing_reason(),
        }


def pairs_line(t: Topology) -> str:
    """Where the batches flow, and whether any leaves its node: the plan's one line on the pairs."""
    pairs = t.pairs()
    if t.colocated:
        return "pairs: none to route (colocated: each rank trains on what it captured)"
    whom = f"{len(pairs)} target -> drafter pair{'s' if len(pairs) != 1 else ''}"
    crossing = t.crossing_reason()
    if crossing is not None:
        return f"pairs: {crossing}"
    if t.nodes > 1:
        return f"pairs: {whom}, none crosses nodes (each node's targets feed its own drafters)"
    return f"pairs: {whom}, on one node"


def choose_topology(
    cfg: TrainConfig,
    inputs: PlanInputs,
    device_type: str,
    gpus_per_node: int,
    nnodes: int = 1,
    free_bytes: int | None = None,
    table: dict[str, RoleRates] | None = None,
) -> TopologyChoice:
    """The topology for a completed trainer config on `gpus_per_node` x `nnodes` devices.

    On CPU a node counts as one device (a colocated rank per node unless `topology.ranks` says more).
    `free_bytes`: the smallest free memory among the GPUs the launch uses (None: unknown, everything fits).
    With several nodes each launcher decides alone, assuming the other nodes alike; `node_local` says
    when this node's free memory changed `auto`'s pick (another node may then pick differently).
    """
    section = cfg.topology
    per_node = gpus_per_node if device_type == "cuda" else 1
    gpus = section.ranks or max(1, per_node) * nnodes
    by_node = nnodes > 1 and section.placement == NODE
    split_gpus, split_nodes = (gpus // nnodes, nnodes) if by_node else (gpus, 1)  # a split is one node's
    fit = memory_fit(inputs, free_bytes if device_type == "cuda" else None)
    rates = (
        rates_for_config(cfg, load_role_rates() if table is None else table)
        if device_type == "cuda"
        else None
    )
    sync = gradient_sync(cfg, inputs, nnodes) if device_type == "cuda" else None
    colocated = project_colocated(rates, gpus, sync) if rates else None
    split = recommend_split(rates, split_gpus, sync, split_nodes).best if rates and split_gpus >= 2 else None
    source = rates.source.split(":")[0] if rates else ""
    if rates and colocated and not colocated.measured:
        source += "; colocated projected as 1 / (1/target + 1/drafter)"
    topology, reason = decide(section, device_type, gpus, fit, colocated, split, nnodes)
    node_local = (
        nnodes > 1
        and section.mode == AUTO
        and fit.free_bytes is not None
        and decide(section, device_type, gpus, memory_fit(inputs, None), colocated, split, nnodes)[0]
        != topology
    )
    unit = "GPU" if device_type == "cuda" else "process"
    return TopologyChoice(
        topology,
        section.mode,
        reason,
        gpus,
        fit,
        colocated,
        split,
        source,
        unit,
        nnodes,
        node_local,
        sync,
        by_node and not topology.colocated,
    )


def gradient_sync(cfg: TrainConfig, inputs: PlanInputs, nodes: int = 1) -> GradientSync:
    """The all-reduce each drafter step waits for at this config's shapes (fp32 gradients of the drafter)."""
    return GradientSync.over(4 * drafter_params(inputs), cfg.optim.batch_size * cfg.optim.grad_accum, nodes)


def decide(
    section: TopologySection,
    device_type: str,
    gpus: int,
    fit: MemoryFit,
    colocated: ColocatedOption | None,
    split: SplitOption | None,
    nodes: int = 1,
) -> tuple[Topology, str]:
    """The topology `section` asks for on `gpus` devices of `nodes` nodes, and why (`auto`: the faster that
    fits; a split by node is `split`, already N x nodes + M x nodes, or one node's fallback)."""
    configured = configured_topology(section, gpus, nodes)
    if configured is not None:
        return configured
    assert section.mode == AUTO
    colocated_all = Topology.colocated_on(gpus, nodes)
    if device_type != "cuda":
        return colocated_all, "auto on CPU: colocated, no role rates to compare"
    by_node = nodes > 1 and section.placement == NODE
    if gpus < (2 * nodes if by_node else 2):
        return colocated_all, "auto on 1 GPU: colocated (a split needs 2)"

    def split_topology(targets: int, drafters: int) -> Topology:
        return Topology(targets, drafters, nodes=nodes, per_node=by_node)

    if not fit.colocated_fits and fit.split_fits:
        fallback = split_topology(nodes, gpus - nodes) if by_node else split_topology(1, gpus - 1)
        best = split_topology(split.targets, split.drafters) if split else fallback
        return best, "auto: colocated does not fit the free memory, the split does"
    if split is None or colocated is None:
        return (
            colocated_all,
            "auto: no role rates at these shapes to compare; colocated (no transport, any GPU count)",
        )
    if split.tok_s > colocated.tok_s and fit.split_fits:
        faster = f"best split {split.tok_s / 1000:,.1f} > colocated {colocated.tok_s / 1000:,.1f} Ktok/s"
        return split_topology(split.targets, split.drafters), f"auto: {faster} on {gpus} GPUs"
    faster = f"colocated {colocated.tok_s / 1000:,.1f} >= best split {split.tok_s / 1000:,.1f} Ktok/s"
    return colocated_all, f"auto: {faster} on {gpus} GPUs"
