"""How many GPUs should capture (targets) and how many should train (drafters): project N+M on G GPUs.

The two roles run at the same time and the slower side sets the pace, so with per-GPU rates measured at
one recipe (samples/s of one target GPU, of one drafter GPU):

    samples/s (N targets + M drafters) = min(N x target_rate, M x drafter_rate);  tok/s = that x seq_len

Drafter ranks also average their gradients every step (DDP's all-reduce of every fp32 gradient); with a
`GradientSync` a drafter GPU's rate counts that wait, as a ring all-reduce of the gradient bytes over a stated
NVLink bus bandwidth, not overlapped with the backward (DDP's buckets do overlap it: a bound, not a guess).
Transport between targets and drafters is still ignored (bench/e2e/e2e.py measures what a real 1+1 loses).
Rates per recipe live in `dflash_doctor/data/role_rates.json` (filled from an H200 run by
`bench/kernels/role_rates.py`; each entry says where its numbers came from).

A colocated GPU does both roles one after the other, so per GPU

    samples/s (colocated) = 1 / (1/target_rate + 1/drafter_rate)    (K GPUs: K x that; DDP sync ignored)

unless the recipe has a measured `colocated_samples_s` (bench/kernels/colocated.py), which wins.

Public API: `recommend_split(rates, gpus, sync)`, `recommendation_for_config(cfg, gpus, table, sync)`,
`load_role_rates(path)`, `project_split(rates, targets, drafters, sync)`, `project_colocated(rates, ranks, sync)`,
`rates_for_config(cfg, table)`, `GradientSync`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_base.errors import DoctorError
from trainer.runspec.topology import WORLD, forces_split, split_of

if TYPE_CHECKING:  # types only: the gate imports the config loader lazily (gate.load_training_config)
    from trainer.runspec.config import TrainConfig

# Shipped with the package, in dflash_doctor/data/.
DEFAULT_RATES_PATH = Path(__file__).resolve().parents[1] / "data" / "role_rates.json"

# The bus bandwidth of NCCL's ring all-reduce between NVLink-connected H200s (NVSwitch, NVLink multicast off as on
# these machines): nccl-tests report ~360 GB/s busbw for large messages on 8-GPU H100/H200 SXM nodes without
# NVLS. A stated figure, not measured here (the machines lent to this project have one GPU).
NVLINK_BUS_BYTES_S = 360e9
# Across nodes the ring's slowest hop is a node's network: one 400 Gb/s InfiniBand NIC per GPU (DGX H100/H200),
# ~45 GB/s of all-reduce bus bandwidth. Also stated, not measured.
INTERNODE_BUS_BYTES_S = 45e9


@dataclass(frozen=True)
class GradientSync:
    """The drafters' gradient all-reduce each optimizer step: every fp32 gradient, ring-reduced over the
    drafter ranks (2 (K-1)/K of the bytes cross each GPU's link)."""

    gradient_bytes: int  # 4 x the drafter's trainable parameters
    sequences_per_step: int  # per drafter rank: optim.batch_size x optim.grad_accum
    bus_bytes_s: float = NVLINK_BUS_BYTES_S
    link: str = "NVLink"  # what `bus_bytes_s` is the bandwidth of

    @classmethod
    def over(cls, gradient_bytes: int, sequences_per_step: int, nodes: int) -> GradientSync:
        """On one node the ring runs over NVLink; over several, a node's network is its slowest hop."""
        if nodes > 1:
            return cls(
                gradient_bytes, sequences_per_step, INTERNODE_BUS_BYTES_S, "InfiniBand (between nodes)"
            )
        return cls(gradient_bytes, sequences_per_step)

    def seconds(self, drafters: int) -> float:
        """One step's all-reduce on `drafters` ranks (none for one: nothing to average)."""
        if drafters <= 1:
            return 0.0
        return 2 * (drafters - 1) / drafters * self.gradient_bytes / self.bus_bytes_s

    def rate(self, per_gpu_samples_s: float, drafters: int) -> float:
        """A drafter GPU's samples/s once every step also waits for the all-reduce."""
        step_s = self.sequences_per_step / per_gpu_samples_s + self.seconds(drafters)
        return self.sequences_per_step / step_s

    def describe(self, drafters: int) -> str:
        gb = self.gradient_bytes / 1e9
        if drafters <= 1:
            return f"gradient all-reduce: none (one drafter rank; {gb:.2f} GB of fp32 gradients)"
        return (
            f"gradient all-reduce: {gb:.2f} GB of fp32 gradients a step, ring 2x({drafters}-1)/{drafters} over "
            f"{self.bus_bytes_s / 1e9:,.0f} GB/s {self.link} bus bandwidth = {self.seconds(drafters) * 1000:.1f} ms a "
            f"step of {self.sequences_per_step} sequence(s) per drafter, counted (not overlapped)"
        )


@dataclass(frozen=True)
class RoleRates:
    """Per-GPU rates of both roles at one recipe (same sequence length, anchors and block size)."""

    recipe: str
    seq_len: int
    anchors: int
    block_size: int
    target_samples_s: float  # one target GPU capturing
    drafter_samples_s: float  # one drafter GPU training
    source: str = ""
    colocated_samples_s: float | None = None  # one GPU doing both, measured; None: projected from the two
    colocated_source: str = ""

    def __post_init__(self) -> None:
        if self.target_samples_s <= 0 or self.drafter_samples_s <= 0 or self.seq_len < 1:
            raise ValueError(f"role rates for {self.recipe} must be positive, got {self}")

    @classmethod
    def from_json(cls, recipe: str, data: dict[str, Any]) -> RoleRates:
        try:
            return cls(
                recipe=recipe,
                seq_len=int(data["seq_len"]),
                anchors=int(data["anchors"]),
                block_size=int(data["block_size"]),
                target_samples_s=float(data["target_samples_s"]),
                drafter_samples_s=float(data["drafter_samples_s"]),
                source=str(data.get("source", "")),
                colocated_samples_s=(
                    float(data["colocated_samples_s"])
                    if data.get("colocated_samples_s") is not None
                    else None
                ),
                colocated_source=str(data.get("colocated_source", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DoctorError(
                f"role rates: the entry for {recipe!r} is malformed ({exc})",
                hint="each recipe needs seq_len, anchors, block_size, target_samples_s, drafter_samples_s",
            ) from None


@dataclass(frozen=True)
class SplitOption:
    """One way to divide the GPUs, and what it would do."""

    targets: int
    drafters: int
    samples_s: float
    tok_s: float
    bottleneck: str  # "target" | "drafter" | "balanced"
    idle_fraction: float  # share of the faster side's capacity left unused

    def __str__(self) -> str:
        return f"{self.targets}+{self.drafters} ({self.tok_s / 1000:,.1f} Ktok/s, {self.bottleneck}-bound)"


@dataclass(frozen=True)
class SplitRecommendation:
    recipe: str
    gpus: int  # of one node when `nodes` > 1 (each node runs the same split)
    best: SplitOption
    options: list[SplitOption]  # every N+M = gpus with N, M >= 1 (each x nodes), best first
    rates: RoleRates
    current: SplitOption | None = None  # the config's own split, when it fits on `gpus`
    nodes: int = 1

    def __str__(self) -> str:
        where = f"{self.gpus} GPUs" if self.nodes == 1 else f"{self.nodes} nodes of {self.gpus} GPUs"
        line = f"{self.best} on {where} for {self.recipe}"
        if self.current is not None and (self.current.targets, self.current.drafters) != (
            self.best.targets,
            self.best.drafters,
        ):
            line += f"; this config's {self.current}"
        origin = self.rates.source.split(":")[0] or "unknown source"  # the full text is in to_json
        return f"{line} [rates: {origin}]"

    def to_json(self) -> dict[str, Any]:
        def option(o: SplitOption) -> dict[str, Any]:
            return {
                "targets": o.targets,
                "drafters": o.drafters,
                "samples_s": round(o.samples_s, 4),
                "tok_s": round(o.tok_s, 1),
                "bottleneck": o.bottleneck,
                "idle_fraction": round(o.idle_fraction, 4),
            }

        return {
            "recipe": self.recipe,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "best": option(self.best),
            "current": option(self.current) if self.current else None,
            "options": [option(o) for o in self.options],
            "rates_source": self.rates.source,
        }


def project_split(
    rates: RoleRates, targets: int, drafters: int, sync: GradientSync | None = None
) -> SplitOption:
    """Throughput of `targets` + `drafters` GPUs: the slower side sets the pace (the drafters' gradient
    all-reduce counted when `sync` is given)."""
    if targets < 1 or drafters < 1:
        raise ValueError(f"a split needs at least one GPU per role, got {targets}+{drafters}")
    supply = targets * rates.target_samples_s
    per_drafter = sync.rate(rates.drafter_samples_s, drafters) if sync else rates.drafter_samples_s
    demand = drafters * per_drafter
    samples = min(supply, demand)
    if abs(supply - demand) <= 1e-9 * max(supply, demand):
        bottleneck = "balanced"
    else:
        bottleneck = "target" if supply < demand else "drafter"
    idle = 1.0 - samples / max(supply, demand)
    return SplitOption(targets, drafters, samples, samples * rates.seq_len, bottleneck, idle)


@dataclass(frozen=True)
class ColocatedOption:
    """K GPUs each holding the target and a drafter replica, and what they would do."""

    ranks: int
    samples_s: float
    tok_s: float
    measured: bool  # a colocated measurement of this recipe, not the projection from the two role rates

    def __str__(self) -> str:
        how = "measured rate" if self.measured else "projected from the role rates"
        return f"colocated x{self.ranks} ({self.tok_s / 1000:,.1f} Ktok/s, {how})"

    def to_json(self) -> dict[str, Any]:
        return {
            "ranks": self.ranks,
            "samples_s": round(self.samples_s, 4),
            "tok_s": round(self.tok_s, 1),
            "measured": self.measured,
        }


def project_colocated(rates: RoleRates, ranks: int, sync: GradientSync | None = None) -> ColocatedOption:
    """Throughput of `ranks` colocated GPUs: each does a whole sample in t_target + t_drafter (and, with
    `sync`, waits for the gradient all-reduce over the ranks every step)."""
    if ranks < 1:
        raise ValueError(f"colocated needs at least one GPU, got {ranks}")
    measured = rates.colocated_samples_s is not None
    per_gpu = rates.colocated_samples_s or 1.0 / (
        1.0 / rates.target_samples_s + 1.0 / rates.drafter_samples_s
    )
    if sync is not None:
        per_gpu = sync.rate(per_gpu, ranks)
    samples = ranks * per_gpu
    return ColocatedOption(ranks, samples, samples * rates.seq_len, measured)


def recommend_split(
    rates: RoleRates, gpus: int, sync: GradientSync | None = None, nodes: int = 1
) -> SplitRecommendation:
    """Every N+M = gpus split, best first (most samples/s; on a tie, the less idle, then more drafters).
    `nodes` > 1: `gpus` are one node's and every node runs the same N+M (placement by node), so each option
    is N x nodes targets + M x nodes drafters, their gradient all-reduce over all M x nodes drafters."""
    if gpus < 2:
        raise ValueError(f"a split needs at least 2 GPUs (one per role), got {gpus}")
    options = [project_split(rates, n * nodes, (gpus - n) * nodes, sync) for n in range(1, gpus)]
    options.sort(key=lambda o: (-round(o.samples_s, 9), o.idle_fraction, -o.drafters))
    return SplitRecommendation(rates.recipe, gpus, options[0], options, rates, nodes=nodes)


def load_role_rates(path: Path | None = None) -> dict[str, RoleRates]:
    """The per-recipe rates table (`{"recipes": {name: {...}}}`); empty when the file does not exist."""
    path = path or DEFAULT_RATES_PATH
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise DoctorError(
            f"role rates: cannot read {path}: {exc}", hint="re-run bench/kernels/role_rates.py"
        ) from None
    recipes = data.get("recipes") if isinstance(data, dict) else None
    if not isinstance(recipes, dict):
        raise DoctorError(
            f"role rates: {path} has no 'recipes' table", hint="re-run bench/kernels/role_rates.py"
        )
    return {name: RoleRates.from_json(name, entry) for name, entry in recipes.items()}


def rates_for_config(cfg: TrainConfig, table: dict[str, RoleRates]) -> RoleRates | None:
    """The entry measured at this config's shapes (sequence length, anchors, block size), if any."""
    shape = (int(cfg.data.seq_len), int(cfg.optim.anchors), int(cfg.drafter.block_size))
    for rates in table.values():
        if (rates.seq_len, rates.anchors, rates.block_size) == shape:
            return rates
    return None


def recommendation_for_config(
    cfg: TrainConfig,
    gpus: int,
    table: dict[str, RoleRates] | None = None,
    sync: GradientSync | None = None,
    nodes: int = 1,
) -> SplitRecommendation | None:
    """The best split of `gpus` GPUs on each of `nodes` nodes for a trainer config (TrainConfig), or None when
    no rates were measured at its shapes or there are fewer than 2 GPUs. Per-sample rates: batch size does
    not change them. `topology.placement = "world"` splits every node's GPUs as one list."""
    if cfg.topology.placement == WORLD:
        gpus, nodes = gpus * nodes, 1
    if gpus < 2:
        return None
    rates = rates_for_config(cfg, load_role_rates() if table is None else table)
    if rates is None:
        return None
    recommendation = recommend_split(rates, gpus, sync, nodes)
    current = None
    if forces_split(cfg.topology) or cfg.topology.mode == "split":  # the config's own split, if it has one
        own = split_of(cfg.topology, nodes)
        fits = own.ranks_per_node <= gpus
        current = project_split(rates, own.targets, own.drafters, sync) if fits else None
    return SplitRecommendation(
        recommendation.recipe, gpus, recommendation.best, recommendation.options, rates, current, nodes
    )
