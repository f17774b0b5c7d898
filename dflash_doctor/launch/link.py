"""Before a multi-node launch: do the nodes meet at the rendezvous endpoint, do they run the same plan, and how
fast is the link between them? One child per node (`link_child.py`, in the audited interpreter) answers all
three beside the gate's checks, at the run's own endpoint, before torchrun starts.

torchrun, given an endpoint nobody answers, a node rank two launchers share, or a node that never comes,
waits out its rendezvous (600 s by default) and then fails with a traceback; nodes given different configs
started every process before stopping at their first collective. Here each is known before anything starts:
the first three are bad input (exit 2, the option and what to give), the last a failing finding naming what
differs (`node_plans.py`). The measured link is judged against what a step moves by `link_budget.py`.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_base.errors import DoctorError
from dflash_doctor.launch.plan import RoleAssignment

CHILD = Path(__file__).with_name("link_child.py")
LINK = "launch.link"  # the report's name in the check context (`ctx.shared`): `launch.nodes` judges it
EXIT_JOIN = 3  # link_child.EXIT_JOIN: a join that did not happen
# How long a node waits for the endpoint to answer and every node to join (`train --join-timeout`). The nodes'
# gates run at once under SLURM or a PyTorch operator; a node whose gate probes anew (a cold deep probe:
# 22.5 s on an H200) or reads a cold disk can lag its peers by tens of seconds, not minutes.
DEFAULT_JOIN_TIMEOUT_S = 120.0
CHILD_MARGIN_S = 120.0  # past the join: the measurement itself (seconds) and the child's imports
# Rendezvous backends whose endpoint is a c10d TCPStore the child can host or join (`--master-addr` is static's).
MEASURED_BACKENDS = (None, "c10d", "static")
GPU_BYTES, GPU_ITERATIONS = 256 << 20, 10  # NCCL: large enough for bus bandwidth, ~0.1 s over 400 Gb/s
CPU_BYTES, CPU_ITERATIONS = 16 << 20, 5  # gloo: ~0.1 s over a 1 GB/s loopback or 10 Gb/s Ethernet


@dataclass(frozen=True)
class LinkRequest:
    """What one node's child is asked: where to meet, who it is, what it runs, what to time."""

    endpoint: str  # HOST:PORT
    option: str  # how the user gave it, for the error: "--rdzv-endpoint" or "--master-addr/--master-port"
    node_rank: int
    nnodes: int
    device_type: str  # "cuda": NCCL; else gloo on the CPU
    plan: dict[str, Any]  # what must be the same on every node (`node_plans.node_plan`)
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S
    run_id: str = "none"
    devices: tuple[
        str, ...
    ] = ()  # one measuring process each: this node's drafter devices (`drafter_devices`)

    def arguments(self, interpreter: str) -> list[str]:
        cuda = self.device_type == "cuda"
        devices = self.devices or (("cuda:0",) if cuda else ("cpu",))
        return [
            interpreter, str(CHILD), "--endpoint", self.endpoint, "--node-rank", str(self.node_rank),
            "--nnodes", str(self.nnodes), "--backend", "nccl" if cuda else "gloo",
            "--devices", ",".join(devices), "--bytes", str(GPU_BYTES if cuda else CPU_BYTES),
            "--iterations", str(GPU_ITERATIONS if cuda else CPU_ITERATIONS),
            "--join-timeout", str(self.join_timeout_s), "--plan", json.dumps(self.plan, sort_keys=True),
            "--run-id", self.run_id,
        ]  # fmt: skip


@dataclass(frozen=True)
class Link:
    """One all-reduce over the run's backend, one process per drafter device of every node: the world the
    run's gradient all-reduce spans."""

    backend: str
    device: str  # "cpu", "cuda:0", or "3 x cuda" (one process on each of this node's 3 drafter GPUs)
    bytes: int
    iterations: int
    seconds: float
    bus_bytes_s: float  # what each process's link carried per second (nccl-tests' bus bandwidth)
    latency_s: float  # one small all-reduce
    processes: int = 2  # in the measurement's world, every node's together

    def describe(self) -> str:
        return (
            f"{self.bus_bytes_s / 1e9:,.2f} GB/s all-reduce bus bandwidth ({self.iterations} x "
            f"{self.bytes / 2**20:,.0f} MiB over {self.backend}, {self.processes} processes on {self.device} "
            f"a node, in {self.seconds:.3f} s), latency {self.latency_s * 1e3:.2f} ms"
        )


@dataclass(frozen=True)
class LinkReport:
    """Every node's plan (by node rank), the link (None when the plans differ), or why there is neither."""

    plans: dict[int, dict[str, Any]]
    link: Link | None
    seconds: float = 0.0  # the child's whole run: imports, the wait for the other nodes, the measurement
    joined_s: float = 0.0  # until every node had joined
    error: DoctorError | None = None  # a join that did not happen: bad input, exit 2
    failure: str | None = None  # the check itself failed (a backend that cannot connect): a failing finding


def link_request(
    endpoint: str | None,
    master: tuple[str | None, int | None],
    rdzv_backend: str | None,
    node_rank: int,
    nnodes: int,
    device_type: str,
    plan: dict[str, Any],
    join_timeout_s: float,
    run_id: str | None,
    devices: tuple[str, ...] = (),
) -> LinkRequest | str:
    """The request for this launch, or why the link is not measured (one node; a rendezvous backend whose
    endpoint is not a store the child can use)."""
    if nnodes < 2:
        return "one node: no link to measure"
    if rdzv_backend not in MEASURED_BACKENDS:
        return f"--rdzv-backend {rdzv_backend}: the link is measured at a c10d or static endpoint only"
    if endpoint:
        where, option = endpoint if ":" in endpoint else f"{endpoint}:29400", "--rdzv-endpoint"
    else:
        where, option = f"{master[0]}:{master[1] or 29500}", "--master-addr/--master-port"
    return LinkRequest(
        where, option, node_rank, nnodes, device_type, plan, join_timeout_s, run_id or "none", devices
    )


def drafter_devices(roles: list[RoleAssignment], node_rank: int, nnodes: int) -> tuple[str, ...]:
    """The devices the link check measures on: this node's drafters' (colocated ranks train too), when every
    node holds the same number of them (the gradient all-reduce's world, node by node); else one process a node
    on its first device (a one-list split whose drafters sit on some nodes only: the batches' path)."""
    trains = [r for r in roles if r.role in ("drafter", "colocated")]
    counts = {node: sum(1 for r in trains if r.node == node) for node in range(nnodes)}
    mine = tuple(r.device for r in trains if r.node == node_rank)
    if len(set(counts.values())) == 1 and mine:
        return mine
    first = next((r.device for r in roles if r.node == node_rank), "cpu")
    return (first,)


def run_link_check(
    interpreter: str, request: LinkRequest, cancel: threading.Event | None = None
) -> LinkReport:
    """This node's child, to its end; never raises for what the nodes did (that is the report)."""
    from dflash_doctor.processes import ChildTimedOut, run_child

    try:
        done = run_child(
            request.arguments(interpreter),
            request.join_timeout_s + CHILD_MARGIN_S,
            "the link check between nodes",
            cwd=str(CHILD.parent.parent.parent),  # never import a `torch/` folder from the user's cwd
            cancel=cancel,
        )
    except ChildTimedOut as exc:
        return LinkReport({}, None, failure=exc.message)
    except OSError as exc:
        return LinkReport({}, None, failure=f"cannot run {interpreter}: {exc}")
    return parse_report(done.stdout, done.stderr, done.returncode, request)


def parse_report(stdout: str, stderr: str, returncode: int, request: LinkRequest) -> LinkReport:
    """Pure: the child's last JSON line as a report; a join that did not happen as the error to raise."""
    document: dict[str, Any] | None = None
    for line in reversed(stdout.strip().splitlines()):
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        if isinstance(parsed, dict):
            document = parsed
            break
    if document is None:
        tail = " | ".join(stderr.strip().splitlines()[-3:])
        return LinkReport({}, None, failure=f"the link check exited {returncode} without a report: {tail}")
    if returncode == EXIT_JOIN:
        return LinkReport({}, None, error=join_error(document, request))
    if returncode != 0 or "error" in document:
        return LinkReport({}, None, failure=str(document.get("detail", document.get("error"))))
    plans = {int(rank): plan for rank, plan in document.get("plans", {}).items()}
    raw = document.get("link")
    link = None
    if isinstance(raw, dict):
        link = Link(
            raw["backend"], raw["device"], int(raw["bytes"]), int(raw["iterations"]), float(raw["seconds"]),
            float(raw["bus_bytes_s"]), float(raw["latency_s"]), int(raw.get("processes", 2)),
        )  # fmt: skip
    return LinkReport(plans, link, float(document.get("seconds", 0.0)), float(document.get("joined_s", 0.0)))


def join_error(document: dict[str, Any], request: LinkRequest) -> DoctorError:
    """Bad input a join revealed, naming the option and what to give."""
    kind, detail = document.get("error"), str(document.get("detail", ""))
    wait = f"{request.join_timeout_s:.0f} s"
    if kind == "rank_taken":
        return DoctorError(
            f"--node-rank {request.node_rank}: another launcher at {request.endpoint} gave the same rank ({detail})",
            hint=f"give each node its own --node-rank, 0 to {request.nnodes - 1}",
        )
    if kind == "missing":
        return DoctorError(
            f"--nnodes {request.nnodes}: node rank(s) {', '.join(str(r) for r in document.get('missing', []))} "
            f"did not join at {request.option} {request.endpoint} within {wait}; nothing was started",
            hint="start `dflash-doctor train ... --nnodes N --node-rank R` on every node with the same endpoint, "
            "within --join-timeout seconds of each other",
        )
    return DoctorError(
        f"{request.option} {request.endpoint} did not answer within {wait} ({detail}); nothing was started",
        hint="give the address and port of node 0, which every node can reach, the same on every node, and start "
        "node 0's launcher too (or wait longer: --join-timeout SECONDS)",
    )
