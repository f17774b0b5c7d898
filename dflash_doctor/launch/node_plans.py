"""What every node of a run must run alike, as plain data the nodes' link checks exchange (`link.py`), and
what differs between two nodes' plans, field by field.

The trainer's ranks compare a hash of the same fields once every process has started (`RunDigest`), and can
only say that a config differs. Before anything starts the launchers can say which field: `optim.steps: node 0
4, node 1 6`. Paths and the output folder are left out: they may differ with each node's disk.
"""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from typing import TYPE_CHECKING, Any

from trainer.runspec.topology import GRAPH_FIELDS

if TYPE_CHECKING:
    from dflash_doctor.launch.plan import LaunchPlan
    from trainer.runspec.config import TrainConfig


def node_plan(cfg: TrainConfig, plan: LaunchPlan) -> dict[str, Any]:
    """This node's topology, process count, device type and graph-relevant config, flattened to dotted keys."""
    out: dict[str, Any] = {"device_type": plan.device_type, "nproc_per_node": plan.nproc_per_node}
    if plan.choice is not None:
        t = plan.choice.topology
        out["topology"] = (
            f"{t.mode} {t.targets}+{t.drafters} ({t.placement})"
            if not t.colocated
            else (f"colocated {t.world_size}")
        )
    for name in GRAPH_FIELDS:
        value: Any = cfg
        for part in name.split("."):
            value = getattr(value, part)
        if is_dataclass(value) and not isinstance(value, type):
            for key, item in asdict(value).items():
                out[f"{name}.{key}"] = _plain(item)
        else:
            out[name] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    """JSON's view of a value (tuples as lists), so a plan compares equal to itself after the round trip."""
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def differences(plans: dict[int, dict[str, Any]]) -> list[str]:
    """`optim.steps: node 0 4, node 1 6`, one line per key whose value is not the same on every node."""
    keys = sorted({key for plan in plans.values() for key in plan})
    lines = []
    for key in keys:
        values = {rank: plans[rank].get(key) for rank in sorted(plans)}
        if len({repr(v) for v in values.values()}) > 1:
            shown = ", ".join(f"node {rank} {_shown(v)}" for rank, v in values.items())
            lines.append(f"{key}: {shown}")
    return lines


def _shown(value: Any) -> str:
    return "(unset)" if value is None else str(value)
