"""Projected tok/s on 8, 16 and 64 GPUs (nodes of 8): colocated, a split by node, and a split as one list over
the nodes, at the shipped recipes' shapes, over NVLink inside a node and InfiniBand or Ethernet between nodes
(issue 59, docs/scale.md). Nothing here runs on a GPU: it is arithmetic on measured and stated figures.

Measured: the per-GPU role rates and colocated rates (`dflash_doctor/data/role_rates.json`, BENCHMARKS 3.2, 3.5:
one H200 each). Stated, not measured here (no machine of several GPUs is lent): the links (`LINKS`), the H100
factor (`H100_FACTOR`). Computed from the recipe: the drafter's fp32 gradient bytes (the memory plan's parameter
count) and the hidden-state bytes of one captured sequence (captured layers x hidden x bf16, + ids and mask).

Models (each a bound, said where it is optimistic or pessimistic):
- colocated on K GPUs: every GPU does both roles; a step of k sequences per GPU takes k / colocated rate plus
  the gradient all-reduce, not overlapped (DDP overlaps its buckets with the backward: pessimistic);
- a split by node (`topology.placement = "node"`): each node runs n targets + m drafters, the best n+m for the
  node; samples/s = nodes x min(n x target rate, m x drafter rate with the all-reduce over all drafters);
  no hidden state leaves its node;
- a split as one list (`"world"`): ranks [0, N) targets over all nodes, the best N+M of all GPUs by the role
  rates, capped by the busiest node's link carrying the batches that cross and the gradient all-reduce
  together (hidden states stream ahead of the drafters, so the link is its own pipeline stage: a cap, not an
  addition; queueing, and NCCL point-to-point sharing the NICs with the all-reduce, are not modelled:
  optimistic);
- the gradient all-reduce over several nodes, hierarchical as NCCL runs it: 2 (g-1)/g x G over NVLink inside
  a node, then 2 (N-1)/N x G through each node's network (all its NICs together).

    python3 -m bench.e2e.scale_projection [--sequences 1 4] [--out bench/results/scale_projection.json]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dflash_base.atomic import write_json_atomic
from dflash_doctor.launch.link_budget import crossing_batches_per_micro_step
from dflash_doctor.launch.memory_plan import (
    GIB,
    colocated_estimate,
    drafter_estimate,
    drafter_params,
    target_estimate,
)
from dflash_doctor.launch.plan import plan_inputs
from dflash_doctor.launch.split import NVLINK_BUS_BYTES_S, RoleRates, load_role_rates
from trainer.runspec.config import load_config
from trainer.runspec.target_shapes import target_shapes
from trainer.runspec.topology import Topology

GPUS_PER_NODE = 8
# Between nodes, all of a node's NICs together, at ~90% of line rate (what NCCL's bus bandwidth reaches on
# large messages): DGX-style H100/H200 nodes carry one 400 Gb/s InfiniBand NIC a GPU; a plain Ethernet cluster
# one 100 Gb/s NIC a node. Stated, not measured here: the gate's link check measures yours (docs/launch.md).
LINKS = {
    "IB 8x400G": 8 * 400e9 / 8 * 0.9,
    "Eth 1x100G": 100e9 / 8 * 0.9,
}
# H100 SXM against H200: the same GH100 die, clocks and bf16 peak; 80 GB of HBM3 at 3.35 TB/s against 141 GB of
# HBM3e at 4.8 TB/s. The roles run compute-bound (59-78% MFU, BENCHMARKS 3.2): assumed 10% slower, not measured.
H100_FACTOR = 0.9
GPU_MEMORY_GIB = {"H200": 139.7, "H100": 79.1}  # what torch reports free on an idle card, about
RECIPES = {"qwen3-8b-b16": "qwen3-8b-b16", "seed-b32": "seed-b32"}


@dataclass(frozen=True)
class Recipe:
    name: str
    seq_len: int
    target_s: float  # samples/s of one target GPU
    drafter_s: float  # of one drafter GPU
    colocated_s: float  # of one GPU doing both (measured)
    gradient_bytes: int
    sequence_bytes: int  # one captured sequence on the wire
    colocated_gib: float
    split_gib: float


def recipe(name: str, rates: RoleRates, factor: float) -> Recipe:
    cfg = load_config(name, [])
    inputs = plan_inputs(cfg, target_shapes(cfg.target.path), "cuda")
    features = len(inputs.captured_layers) * inputs.target.hidden
    colocated = rates.colocated_samples_s or 1 / (1 / rates.target_samples_s + 1 / rates.drafter_samples_s)
    return Recipe(
        name,
        rates.seq_len,
        rates.target_samples_s * factor,
        rates.drafter_samples_s * factor,
        colocated * factor,
        4 * drafter_params(inputs),
        inputs.seq_len * (features * 2 + 9),
        colocated_estimate(inputs).total / GIB,
        max(target_estimate(inputs).total, drafter_estimate(inputs).total) / GIB,
    )


def sync_s(gradient_bytes: int, drafters: int, nodes: int, node_bytes_s: float) -> float:
    """The drafters' all-reduce, hierarchical: NVLink inside each node, then the nodes' networks."""
    if drafters <= 1:
        return 0.0
    local = max(1, drafters // nodes)
    inside = 2 * (local - 1) / local * gradient_bytes / NVLINK_BUS_BYTES_S if local > 1 else 0.0
    between = 2 * (nodes - 1) / nodes * gradient_bytes / node_bytes_s if nodes > 1 else 0.0
    return inside + between


def drafter_rate(r: Recipe, k: int, drafters: int, nodes: int, link: float) -> float:
    """One drafter GPU's samples/s with `k` sequences a step and the all-reduce not overlapped."""
    return k / (k / r.drafter_s + sync_s(r.gradient_bytes, drafters, nodes, link))


def colocated(r: Recipe, gpus: int, k: int, link: float) -> float:
    nodes = max(1, gpus // GPUS_PER_NODE)
    return gpus * k / (k / r.colocated_s + sync_s(r.gradient_bytes, gpus, nodes, link))


def split_by_node(r: Recipe, gpus: int, k: int, link: float) -> tuple[float, str]:
    nodes, per = max(1, gpus // GPUS_PER_NODE), min(gpus, GPUS_PER_NODE)
    best = max(
        (nodes * min(n * r.target_s, (per - n) * drafter_rate(r, k, (per - n) * nodes, nodes, link)), n)
        for n in range(1, per)
    )
    return best[0], f"{best[1]}+{per - best[1]} a node"


def split_one_list(r: Recipe, gpus: int, k: int, link: float) -> tuple[float, str]:
    nodes = max(1, gpus // GPUS_PER_NODE)
    options = []
    for n in range(1, gpus):
        m = gpus - n
        supply, demand = n * r.target_s, m * drafter_rate(r, k, m, nodes, link)
        topology = Topology(n, m, nodes=nodes, per_node=False)
        crossing = 0.0
        if nodes > 1:  # the busiest node's share of every sample's bytes, through its own link
            crossing = crossing_batches_per_micro_step(topology) / m
        # that link also carries the gradient all-reduce: 2 (N-1)/N x G a step of m x k samples
        shared = 2 * (nodes - 1) / nodes * r.gradient_bytes / (m * k) if nodes > 1 else 0.0
        cap = link / (crossing * r.sequence_bytes + shared) if crossing else float("inf")
        options.append((min(supply, demand, cap), n, m, cap))
    best = max(options)
    capped = " (link-bound)" if best[3] <= best[0] * 1.0001 else ""
    return best[0], f"{best[1]}+{best[2]}{capped}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, nargs="+", default=[1, 4], help="sequences per drafter step")
    parser.add_argument("--out", type=Path, default=Path("bench/results/scale_projection.json"))
    args = parser.parse_args()
    table = load_role_rates()
    rows: list[dict[str, Any]] = []
    console = Console()
    for gpu, factor in (("H200", 1.0), ("H100", H100_FACTOR)):
        for name in RECIPES:
            r = recipe(name, table[name], factor)
            fits = r.colocated_gib <= GPU_MEMORY_GIB[gpu]
            view = Table(
                title=f"{gpu} {name}: gradients {r.gradient_bytes / 1e9:.2f} GB a step, a sequence "
                f"{r.sequence_bytes / 1e6:,.0f} MB on the wire; colocated {r.colocated_gib:.1f} GiB a GPU"
                f"{'' if fits else ' (does not fit)'}",
                title_justify="left",
            )
            for column in ("GPUs", "link", "k", "colocated Ktok/s", "by node Ktok/s", "one list Ktok/s"):
                view.add_column(column)
            for gpus in (8, 16, 64):
                for link_name, link in LINKS.items():
                    if gpus == GPUS_PER_NODE and link_name != next(iter(LINKS)):
                        continue  # one node: no network between nodes
                    for k in args.sequences:
                        co = colocated(r, gpus, k, link) if fits else None
                        node, node_shape = split_by_node(r, gpus, k, link)
                        world, world_shape = split_one_list(r, gpus, k, link)
                        row = {
                            "gpu": gpu, "recipe": name, "gpus": gpus,
                            "link": "NVLink only" if gpus == GPUS_PER_NODE else link_name, "sequences_per_step": k,
                            "colocated_tok_s": round(co * r.seq_len) if co else None,
                            "by_node_tok_s": round(node * r.seq_len), "by_node_split": node_shape,
                            "one_list_tok_s": round(world * r.seq_len), "one_list_split": world_shape,
                        }  # fmt: skip
                        rows.append(row)
                        view.add_row(
                            str(gpus), row["link"], str(k),
                            f"{co * r.seq_len / 1e3:,.1f}" if co else "does not fit",
                            f"{node * r.seq_len / 1e3:,.1f} ({node_shape})",
                            f"{world * r.seq_len / 1e3:,.1f} ({world_shape})",
                        )  # fmt: skip
            console.print(view)
    write_json_atomic(
        args.out,
        {
            "links_bytes_s": LINKS,
            "nvlink_bus_bytes_s": NVLINK_BUS_BYTES_S,
            "h100_factor": H100_FACTOR,
            "rows": rows,
        },
    )
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
