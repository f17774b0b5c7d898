"""A launch that cannot work never starts: topology against the devices, memory plan against free memory,
disk plan against free space.

The topology finding also says why this one (`topology.mode`, or what `auto` compared).

These run only for `dflash-doctor train` (they need a training config): the gate puts the validated
config and its LaunchPlan in the context (`options.config`, `options.extra["launch_plan"]`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from dflash_base.disk import existing_ancestor, free_bytes, size_text
from dflash_doctor.context import CheckContext
from dflash_doctor.env.gpus import GpuInventory, gpu_inventory
from dflash_doctor.env.visible_devices import VARIABLE
from dflash_doctor.findings import Finding, fail, ok, skip, warn
from dflash_doctor.launch.memory_plan import HOST_AVAILABLE, host_available_bytes
from dflash_doctor.registry import check

if TYPE_CHECKING:  # imported when a launch is checked, not by every `check` (psutil, the plan)
    from dflash_doctor.launch.disk_plan import DiskWrite
    from dflash_doctor.launch.plan import LaunchPlan

GIB = 1024**3
LOW_HEADROOM = 0.10  # warn under 10% spare


def _plan(ctx: CheckContext) -> LaunchPlan:
    from dflash_doctor.launch.plan import LaunchPlan

    plan = ctx.options.extra.get("launch_plan")
    if not isinstance(plan, LaunchPlan):
        raise RuntimeError("launch checks need a LaunchPlan in options.extra['launch_plan']")
    return plan


def _gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def _topology_remedy(plan: LaunchPlan, gpus: int) -> str:
    """How to make the topology fit `gpus` devices per node, for the mode the config asked for."""
    choice = plan.choice
    if choice is not None and choice.topology.colocated:
        return f"lower topology.ranks to {gpus * plan.nnodes} (or remove it: every GPU is used)"
    by_node = choice is not None and choice.topology.per_node
    room = f"{gpus} (one node's)" if by_node and plan.nnodes > 1 else f"{gpus * plan.nnodes}"
    return (
        f"shrink topology.targets + topology.drafters to {room}, or remove both so "
        'topology.mode = "auto" picks for the GPUs present (or spread over nodes with --nnodes)'
    )


def _crossing(plan: LaunchPlan) -> Iterator[Finding]:
    """A split whose pairs cross nodes: said, with why and what keeps hidden states on their node."""
    if plan.choice is None or (reason := plan.choice.topology.crossing_reason()) is None:
        return
    t = plan.choice.topology
    yield warn(
        "launch.topology.crossing",
        f"{reason}; the link between nodes carries them (launch.link measures it before a launch)",
        remedy='topology.placement = "node" (every node runs its own targets and drafters: at least 2 '
        'GPUs a node), or topology.mode = "colocated"',
        pairs=[
            f"rank {a} (node {t.node_of(a)}) -> rank {b} (node {t.node_of(b)})" for a, b in t.crossing_pairs()
        ][:16],
    )


@check("launch.topology", "launch topology", requires=["config"])
def topology(ctx: CheckContext) -> Iterator[Finding]:
    plan = _plan(ctx)
    shape = plan.shape
    why = {"why": plan.choice.reason, "projections": plan.choice.lines()[1:]} if plan.choice else {}
    if plan.world_size % plan.nnodes:
        unit = "topology.ranks" if plan.mode == "colocated" else "topology.targets + topology.drafters"
        yield fail(
            "launch.topology.nodes",
            f"{shape} do not split evenly over {plan.nnodes} nodes",
            remedy=f"choose --nnodes that divides {unit} ({plan.world_size})",
            world_size=plan.world_size,
            nnodes=plan.nnodes,
        )
        return
    if plan.device_type == "cpu":
        cores = os.cpu_count() or 1
        if plan.nproc_per_node > cores:
            yield warn(
                "launch.topology.oversubscribed",
                f"{plan.nproc_per_node} processes on {cores} CPU cores: it will run, slowly",
                remedy="use fewer ranks on CPU, or a GPU machine",
                processes=plan.nproc_per_node,
                cores=cores,
            )
            return
        processes = f"{plan.nproc_per_node} process{'es' if plan.nproc_per_node != 1 else ''}"
        yield ok("launch.topology", f"{shape} on CPU (gloo), {processes}", cores=cores, **why)
        yield from _crossing(plan)
        return
    gpus = gpu_inventory(ctx)
    if not isinstance(gpus, GpuInventory):
        yield fail(
            "launch.topology.no_gpu",
            f"the config asks for CUDA ({shape} = {plan.nproc_per_node} GPUs on this node) but there is no usable GPU",
            remedy='run on a GPU machine, or set run.device = "cpu" in the config for a CPU run',
            reason=str(gpus),
        )
        return
    have = len(gpus.devices)
    visibility = gpus.visibility_facts()
    hidden = (
        f" ({len(gpus.hidden)} more hidden by {VARIABLE}={gpus.visible_devices!r})" if gpus.hidden else ""
    )
    if have < plan.nproc_per_node:
        remedy = _topology_remedy(plan, have)
        if gpus.hidden:
            remedy += (
                f"; or let {VARIABLE} show {plan.nproc_per_node} GPUs (unset it to use all {len(gpus.host)})"
            )
        yield fail(
            "launch.topology.too_few_gpus",
            f"{shape} needs {plan.nproc_per_node} GPUs on this node, {have} found{hidden}",
            remedy=remedy,
            needed=plan.nproc_per_node,
            found=have,
            gpus=[f"cuda:{i} = {d.label}: {d.name}" for i, d in enumerate(gpus.devices)],
            **visibility,
        )
        return
    roles = [f"rank {r.rank} {r.role} -> {r.device}" for r in plan.roles if r.node == 0]
    reason = f": {plan.choice.reason}" if plan.choice else ""
    yield ok(
        "launch.topology",
        f"{shape} on {plan.nproc_per_node} of {have} GPUs{hidden}{reason}",
        roles=roles,
        **why,
        **visibility,
    )
    yield from _crossing(plan)
    if plan.choice is not None and plan.choice.node_local:
        free = plan.choice.fit.free_bytes or 0
        yield warn(
            "launch.topology.node_local",
            f"auto chose {shape} from this node's free GPU memory ({_gib(free)}); each of the "
            f"{plan.nnodes} nodes decides alone, so one with more free memory may choose otherwise",
            remedy=f"pin the topology on every node: {plan.choice.pin} (or free the memory this node's GPUs hold)",
            free_bytes=free,
        )


@check("launch.memory", "launch memory plan", requires=["config"])
def memory(ctx: CheckContext) -> Iterator[Finding]:
    plan = _plan(ctx)
    estimates = {role: est.total for role, est in plan.memory.items()}
    parts = {role: {k: _gib(v) for k, v in est.parts.items()} for role, est in plan.memory.items()}
    if plan.device_type == "cpu":
        need = sum(estimates[r.role] for r in plan.roles if r.node == 0)
        have = ctx.shared(HOST_AVAILABLE, host_available_bytes)  # read by the gate before it started anything
        yield from _verdict("host memory", need, have, estimates, parts)
        return
    gpus = gpu_inventory(ctx)
    if not isinstance(gpus, GpuInventory):
        return  # launch.topology already failed for this; nothing to compare against
    worst: tuple[float, str, int, int] | None = None
    per_device = []
    for role in plan.roles:
        if role.node != 0:
            continue
        index = int(role.device.split(":")[1])
        if index >= len(gpus.devices):
            continue
        device = gpus.devices[index]
        need = estimates[role.role]
        spare = (device.free_bytes - need) / device.free_bytes if device.free_bytes else -1.0
        per_device.append(f"{role.device} {role.role}: needs {_gib(need)} of {_gib(device.free_bytes)} free")
        if worst is None or spare < worst[0]:
            worst = (spare, role.device, need, device.free_bytes)
    if worst is None:
        return
    spare, where, need, free = worst
    remedy = None
    if plan.choice is not None and plan.choice.topology.colocated:
        split = plan.choice.split_that_fits()
        remedy = f"colocated holds the target and a drafter on every GPU; {split}" if split else None
    yield from _verdict(f"{where} memory", need, free, estimates, parts, per_device, remedy)


def _verdict(
    what: str,
    need: int,
    have: int,
    estimates: dict[str, int],
    parts: dict[str, dict[str, str]],
    per_device: list[str] | None = None,
    remedy: str | None = None,
) -> Iterator[Finding]:
    evidence: dict[str, object] = {
        "needed": _gib(need),
        "available": _gib(have),
        **{f"{role}_estimate": _gib(total) for role, total in estimates.items()},
        **{f"{role}_parts": p for role, p in parts.items()},
    }
    if per_device:
        evidence["devices"] = per_device
    if need > have:
        yield fail(
            "launch.memory.over_budget",
            f"estimated peak {_gib(need)} does not fit the {_gib(have)} free on {what}",
            remedy=remedy
            or "lower optim.anchors, optim.batch_size, data.seq_len or drafter.loss_chunk; or free the memory",
            **evidence,
        )
    elif have and (have - need) / have < LOW_HEADROOM:
        yield warn(
            "launch.memory.tight",
            f"estimated peak {_gib(need)} leaves under 10% of the {_gib(have)} free on {what}",
            remedy="lower optim.anchors or drafter.loss_chunk for headroom",
            **evidence,
        )
    else:
        yield ok(
            "launch.memory", f"estimated peak {_gib(need)} fits the {_gib(have)} free on {what}", **evidence
        )


def free_space(path: str) -> tuple[int, int | None]:
    """(the file system's id, its free bytes) where `path` is, or will be made (its nearest existing folder)."""
    where = existing_ancestor(path)
    return os.stat(where).st_dev, free_bytes(where)


# A snapshot is taken only after a success, and a failed one leaves the run's result intact ("no snapshot: ..."
# in its record): a store that cannot hold it warns, an output folder that cannot hold the run fails.
OUTPUT_WRITES = frozenset({"checkpoints", "export", "metrics"})


@check("launch.disk", "launch disk plan", requires=["config"])
def disk(ctx: CheckContext) -> Iterator[Finding]:
    plan = _plan(ctx)
    if not plan.disk:
        return
    systems: dict[int, list[DiskWrite]] = {}
    free: dict[int, int | None] = {}
    for write in plan.disk:
        device, free[device] = free_space(write.path)
        systems.setdefault(device, []).append(write)
    lines, worst = [], None
    for device, writes in systems.items():
        need, have = sum(w.bytes for w in writes), free[device]
        parts = ", ".join(f"{w.what} {size_text(w.bytes)}" for w in writes)
        where = " and ".join(dict.fromkeys(_folder_of(w) for w in writes))
        lines.append(f"{where}: {parts}; {size_text(have)} free")
        if have is None:
            continue
        spare = (have - need) / have if have else -1.0
        if worst is None or spare < worst[0]:
            worst = (spare, need, have, where, parts, writes)
    evidence: dict[str, object] = {
        "writes": [f"{w.what}: {size_text(w.bytes)} in {w.path}: {w.detail}" for w in plan.disk],
        "file_systems": lines,
    }
    if worst is None:
        yield warn(
            "launch.disk.unknown",
            "the free space where the run writes could not be read",
            "check that output.dir and DFLASH_DOCTOR_HOME are folders you can read",
            **evidence,
        )
        return
    spare, need, have, where, parts, writes = worst
    trains = any(w.what in OUTPUT_WRITES for w in writes)
    said = f"the run writes {size_text(need)} to {where} ({parts}) and {size_text(have)} are free there"
    if need > have and trains:
        yield fail("launch.disk.full", said, remedy=_disk_remedy(plan.disk), **evidence)
    elif need > have:
        yield warn(
            "launch.disk.store_full",
            f"{said}: the run trains, but the compile-cache snapshot after it will not fit",
            remedy="dflash-doctor cache prune --keep 1, or set DFLASH_DOCTOR_HOME to a folder on a larger disk",
            **evidence,
        )
    elif spare < LOW_HEADROOM:
        yield warn(
            "launch.disk.tight", f"{said}: under 10% to spare", remedy=_disk_remedy(plan.disk), **evidence
        )
    else:
        yield ok("launch.disk", f"{said}", **evidence)


def _folder_of(write: DiskWrite) -> str:
    """The run's output folder for its own files, the store for the snapshot."""
    return os.path.dirname(write.path) if write.what in ("checkpoints", "export") else write.path


def _disk_remedy(writes: list[DiskWrite]) -> str:
    each = next((w.each for w in writes if w.what == "checkpoints" and w.each), None)
    one = f" (each checkpoint is {size_text(each)})" if each else ""
    return f"free space there, point output.dir at a larger disk, or lower checkpoint.keep{one}"


# ---------------------------------------------------------------- several nodes: do they agree, can the link carry it


@check("launch.nodes", "the nodes and the link between them", requires=["config"])
def nodes(ctx: CheckContext) -> Iterator[Finding]:
    """A multi-node launch: every node runs the same plan, and the step does not wait on the network more than
    a stated share of its time (`launch/link_budget.py`). Quiet on one node."""
    from dflash_doctor.launch.link import LINK, LinkReport
    from dflash_doctor.launch.link_budget import LinkVerdict, step_traffic
    from dflash_doctor.launch.node_plans import differences

    plan = _plan(ctx)
    if plan.nnodes < 2:
        return
    report = ctx.shared(LINK, lambda: None)
    if not isinstance(report, LinkReport):
        why = ctx.options.extra.get("link_skipped", "not measured")
        yield skip("launch.nodes", f"{plan.nnodes} nodes: the link between them is not measured ({why})")
        return
    if report.error is not None:  # a join that did not happen: the gate stops with it (exit 2)
        return
    # a warning, not a refusal: the check itself is what failed (the nodes met)
    if report.failure is not None:
        yield warn(
            "launch.nodes.link_failed",
            f"the {plan.nnodes} nodes met, but timing the link between them failed: {report.failure}; the run's "
            "own collectives may fail the same way",
            remedy="`dflash-doctor check --deep` on each node says whether its torch.distributed backend works",
        )
        return
    differ = differences(report.plans)
    if differ:
        yield fail(
            "launch.nodes.differ",
            f"the {plan.nnodes} nodes would run different plans: {'; '.join(differ[:6])}",
            remedy="give every node the same config file and the same --set overrides (a topology decided "
            "per node: pin it on every node, as the plan's topology line says)",
            differences=differ,
        )
        return
    assert report.link is not None  # the plans agree: the child measured
    config = ctx.options.config
    assert config is not None  # requires=["config"]
    time = plan.time
    step_s, source = (time.step_s, f"{time.source}: {time.basis}") if time is not None else (None, "none")
    verdict = LinkVerdict(step_traffic(config, plan), report.link, step_s, source)
    said = (
        f"{plan.nnodes} nodes agree and met in {report.joined_s:.1f} s; link: {report.link.describe()}; "
        f"a step needs {verdict.needs()}: {verdict.against_step()}"
    )
    evidence = {"link": verdict.to_json(), "seconds": report.seconds}
    if verdict.too_slow:
        yield fail(
            "launch.nodes.slow_link",
            f"the step would wait on the network longer than it may: {said}",
            remedy='keep hidden states on their node (topology.placement = "node"), use fewer nodes or a faster '
            "network between them, or larger steps (optim.grad_accum); --force launches it anyway (recorded)",
            **evidence,
        )
    elif verdict.share is None:
        yield warn(
            "launch.nodes",
            f"{said}: printed, not judged",
            remedy="the next launch of this config on this machine has its measured step time to judge by",
            **evidence,
        )
    else:
        yield ok("launch.nodes", said, **evidence)
