"""What one training step moves between nodes, and whether the measured link can carry it (issue 59).

Two things can cross nodes in a step: the drafters' gradient all-reduce (every fp32 gradient, a ring over
the M drafter ranks: 2 (M-1)/M of the bytes through each node's link), and, only when a target feeds a drafter
on another node (`topology.placement = "world"`), the captured batches themselves: B x S x (captured layers x
hidden) hidden states, plus the token ids and the loss mask. Placement by node keeps the second at zero.

The step waits on the network for at most (gradient bytes x 2 (M-1)/M + the busiest node's crossing batch
bytes) / the measured bus bandwidth: a bound, since DDP overlaps its buckets with the backward. A launch whose
step would wait more than `MAX_NETWORK_SHARE` of a step is refused, with the numbers (`--force` launches it
anyway, recorded): at that share a quarter of every GPU-second or more goes to waiting on the wire, and the
fixes (placement by node, fewer nodes, a faster network) are cheaper than the lost time.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dflash_base.disk import size_text
from dflash_doctor.launch.memory_plan import drafter_params

if TYPE_CHECKING:
    from dflash_doctor.launch.link import Link
    from dflash_doctor.launch.plan import LaunchPlan
    from trainer.runspec.config import TrainConfig
    from trainer.runspec.topology import Topology

MAX_NETWORK_SHARE = 0.25


@dataclass(frozen=True)
class StepTraffic:
    """Bytes one optimizer step moves between nodes, at the run's shapes and topology."""

    gradient_bytes: int  # fp32 gradients of the drafter (all-reduced when there are 2+ drafter ranks)
    drafters: int
    batch_bytes: int  # one captured batch on the wire: hidden states, token ids, loss mask
    crossing_batches: float  # per step, through the busiest node's link (0: no pair crosses nodes)

    @property
    def all_reduce_bytes(self) -> float:
        """Through each node's link per step: 2 (M-1)/M of the gradients (a ring; none for one drafter)."""
        m = self.drafters
        return 0.0 if m <= 1 else 2 * (m - 1) / m * self.gradient_bytes

    @property
    def crossing_bytes(self) -> float:
        return self.crossing_batches * self.batch_bytes

    def to_json(self) -> dict[str, Any]:
        return {
            "gradient_bytes": self.gradient_bytes,
            "drafters": self.drafters,
            "all_reduce_bytes": round(self.all_reduce_bytes),
            "batch_bytes": self.batch_bytes,
            "crossing_batches_per_step": round(self.crossing_batches, 4),
            "crossing_bytes": round(self.crossing_bytes),
        }


def wire_bytes_per_element(cfg: TrainConfig, on_gpu: bool) -> int:
    """The hidden states' dtype on the wire is `target.dtype` (auto: bf16 on CUDA, fp32 on CPU)."""
    dtype = cfg.target.dtype
    if dtype == "auto":
        return 2 if on_gpu else 4
    return 4 if dtype == "fp32" else 2


def crossing_batches_per_micro_step(topology: Topology) -> float:
    """Batches a micro-step sends through the busiest node's link (out of it, or into it): the routing repeats
    every N x M batches, M of them per micro-step."""
    if topology.colocated:
        return 0.0
    period = topology.targets * topology.drafters
    out_of: Counter[int] = Counter()
    into: Counter[int] = Counter()
    for i in range(period):
        src, dst = topology.producer_of(i), topology.drafter_rank(topology.consumer_of(i))
        if topology.node_of(src) != topology.node_of(dst):
            out_of[topology.node_of(src)] += 1
            into[topology.node_of(dst)] += 1
    busiest = max([*out_of.values(), *into.values()], default=0)
    return busiest / (period / topology.drafters)


def step_traffic(cfg: TrainConfig, plan: LaunchPlan) -> StepTraffic:
    """The traffic of one step of this launch (its memory plan's shapes, its topology)."""
    inputs = plan.memory_inputs
    assert inputs is not None and plan.choice is not None, "a built launch plan has both"
    topology = plan.choice.topology
    features = len(inputs.captured_layers) * inputs.target.hidden
    tokens = inputs.batch_size * inputs.seq_len
    batch = tokens * (
        features * wire_bytes_per_element(cfg, inputs.on_gpu) + 8 + 1
    )  # + int64 ids, uint8 mask
    per_step = crossing_batches_per_micro_step(topology) * cfg.optim.grad_accum
    return StepTraffic(4 * drafter_params(inputs), topology.drafters, batch, per_step)


@dataclass(frozen=True)
class LinkVerdict:
    """The step's wait on the network at the measured bandwidth, against the step's own time."""

    traffic: StepTraffic
    link: Link
    step_s: float | None  # one step's seconds (the time plan's figure; None: none known)
    step_source: str  # where step_s came from

    @property
    def gradient_s(self) -> float:
        return self.traffic.all_reduce_bytes / self.link.bus_bytes_s

    @property
    def hidden_s(self) -> float:
        return self.traffic.crossing_bytes / self.link.bus_bytes_s

    @property
    def network_s(self) -> float:
        return self.gradient_s + self.hidden_s

    @property
    def share(self) -> float | None:
        return None if not self.step_s else self.network_s / self.step_s

    @property
    def too_slow(self) -> bool:
        return self.share is not None and self.share > MAX_NETWORK_SHARE

    def needs(self) -> str:
        """`3.9 GB of gradients (ring over 6 drafter ranks: 6.5 GB through each node's link); no hidden states
        (no pair crosses nodes) = 145.2 ms on the network`."""
        t = self.traffic
        parts = [
            f"{size_text(t.gradient_bytes)} of gradients (ring over {t.drafters} drafter rank"
            f"{'s' if t.drafters != 1 else ''}: {size_text(round(t.all_reduce_bytes))} through each node's link)"
        ]
        if t.crossing_batches:
            parts.append(
                f"{size_text(round(t.crossing_bytes))} of hidden states ({t.crossing_batches:g} batch"
                f"{'es' if t.crossing_batches != 1 else ''} of {size_text(t.batch_bytes)} through the busiest "
                "node's link: pairs cross nodes)"
            )
        else:
            parts.append("no hidden states (no pair crosses nodes)")
        return "; ".join(parts) + f" = {self.network_s * 1e3:,.1f} ms on the network"

    def against_step(self) -> str:
        if self.share is None or self.step_s is None:
            return f"no step time to weigh it against ({self.step_source})"
        return (
            f"{self.share:.1%} of a {self.step_s * 1e3:,.0f} ms step ({self.step_source}); the limit is "
            f"{MAX_NETWORK_SHARE:.0%}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **self.traffic.to_json(),
            "bus_bytes_s": round(self.link.bus_bytes_s),
            "gradient_s": round(self.gradient_s, 6),
            "hidden_s": round(self.hidden_s, 6),
            "network_s": round(self.network_s, 6),
            "step_s": round(self.step_s, 6) if self.step_s is not None else None,
            "share": round(self.share, 4) if self.share is not None else None,
            "max_share": MAX_NETWORK_SHARE,
        }
