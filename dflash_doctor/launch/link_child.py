"""The link check between the nodes of a multi-node launch: runs INSIDE the audited interpreter, one per node,
and prints one JSON document on stdout.

Stdlib + torch only (the audited environment need not have dflash_doctor), runnable as a plain script:

    python link_child.py --endpoint HOST:PORT --node-rank R --nnodes N --backend gloo|nccl
        --devices cpu|cuda:5,cuda:6,cuda:7 --bytes B --iterations K --join-timeout S --plan JSON [--run-id ID]

Before torchrun starts, every node's launcher runs this child at the run's own rendezvous endpoint: the node
whose address it is hosts a store there (any other binding it is a client; on one host, the first to bind),
each node claims its rank, leaves what it will run (`--plan`) and waits for the others, so that a node given
another config, a rank taken twice or an endpoint nobody answers is known before any process is started. Then
one process per drafter device of each node (`--devices`) joins a process group over the run's backend and
times an all-reduce of `--bytes` (`--iterations` of them, after one warm-up): the world the run's gradient
all-reduce spans, so the figure is what it will move at (NVLink inside a node, every NIC between nodes). The host leaves last, so nobody loses the store mid-way; the port is
free again for torchrun's rendezvous when every child has exited.

Exit status: 0 with a report (`plans` of every node, and `link` unless the plans differ); 3 with `error` one
of "unreachable" (the endpoint did not answer within the join timeout), "rank_taken" (another launcher gave
this --node-rank), "missing" (not every node joined in time); 1 for anything else (its `detail`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

LINK_SCHEMA = "dflash-doctor/link/v1"
EXIT_JOIN = 3  # a join that did not happen: the launcher turns it into exit 2 naming the option
FINISH_WAIT_S = 30.0  # how long the host waits for every node to say it is done before it closes the store


def emit(document: dict[str, Any], code: int) -> None:
    print(json.dumps({"schema": LINK_SCHEMA, **document}), flush=True)
    sys.exit(code)


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def is_local(host: str) -> bool:
    """Whether `host` names this machine (torchrun's own test, so the same node hosts both stores)."""
    try:
        from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname

        return bool(_matches_machine_hostname(host))
    except ImportError:  # torch without the elastic helpers: the plain names of this machine
        return host in ("localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn())


def open_store(host: str, port: int, timeout_s: float) -> tuple[Any, bool]:
    """(store, hosting): host it when the endpoint is this machine and the port is free, else join it."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    if is_local(host):
        try:
            return dist.TCPStore(host, port, is_master=True, timeout=timeout, wait_for_workers=False), True
        except RuntimeError as exc:  # EADDRINUSE: another node on this host (or a test) hosts it
            if "EADDRINUSE" not in str(exc) and "address already in use" not in str(exc):
                raise
    try:
        return dist.TCPStore(host, port, is_master=False, timeout=timeout), False
    except RuntimeError as exc:  # DistNetworkError: nothing listens there, or not reachable in time
        emit({"error": "unreachable", "detail": str(exc).splitlines()[0][:300]}, EXIT_JOIN)
        raise  # not reached


def join(store: Any, args: argparse.Namespace, deadline: float) -> dict[int, Any]:
    """Claim this node's rank, leave its plan, wait for every node's; every node's plan by rank."""
    me = f"{socket.gethostname()} pid {os.getpid()}"
    holder = store.compare_set(f"rank/{args.node_rank}", "", me).decode()
    if holder != me:
        emit({"error": "rank_taken", "detail": holder}, EXIT_JOIN)
    store.set(f"plan/{args.node_rank}", args.plan)
    keys = [f"plan/{r}" for r in range(args.nnodes)]
    while True:
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
        if not missing:
            break
        if time.monotonic() > deadline:
            emit({"error": "missing", "missing": missing, "detail": f"node ranks {missing}"}, EXIT_JOIN)
        time.sleep(0.2)
    return {r: json.loads(store.get(key)) for r, key in enumerate(keys)}


def measure(args: argparse.Namespace, timeout_s: float) -> dict[str, Any]:
    """The all-reduce the run's drafters will do: one process per drafter device of this node (`--devices`),
    every node's together (the world the run's gradient all-reduce spans: NVLink inside a node, the network
    between), the run's backend. One device: in this process; several: spawned, one each."""
    import torch.multiprocessing as mp

    devices = args.devices.split(",")
    if len(devices) == 1:
        return timed_all_reduce(args, 0, timeout_s)
    result = Path(tempfile.mkdtemp(prefix="dflash-link-")) / "local0.json"
    mp.start_processes(
        measure_on, args=(args, timeout_s, str(result)), nprocs=len(devices), join=True, start_method="spawn"
    )
    report: dict[str, Any] = json.loads(result.read_text())
    shutil.rmtree(result.parent, ignore_errors=True)
    return report


def measure_on(local: int, args: argparse.Namespace, timeout_s: float, result: str) -> None:
    """A spawned process of `measure`: its device's share; local process 0 writes the node's figure."""
    report = timed_all_reduce(args, local, timeout_s)
    if local == 0:
        Path(result).write_text(json.dumps(report))


def timed_all_reduce(args: argparse.Namespace, local: int, timeout_s: float) -> dict[str, Any]:
    """Process `local` of this node in the measurement's world (every node's devices): a warm-up all-reduce,
    then `iterations` timed ones of `bytes` (the slowest process's time counts), and 10 one-element ones for
    the latency. It reaches the store the parent joined as a client of its own."""
    import torch
    import torch.distributed as dist

    devices = args.devices.split(",")
    device = torch.device(devices[local])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    host, port = parse_endpoint(args.endpoint)
    client = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
    width = len(devices)
    dist.init_process_group(
        args.backend,
        store=dist.PrefixStore(f"dflash-doctor/link/{args.run_id}/pg/", client),
        rank=args.node_rank * width + local,
        world_size=args.nnodes * width,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    try:
        payload = torch.ones(max(1, args.bytes // 4), dtype=torch.float32, device=device)
        tiny = torch.ones(1, dtype=torch.float32, device=device)

        def timed(tensor: torch.Tensor, count: int) -> float:
            dist.barrier()
            began = time.perf_counter()
            for _ in range(count):
                dist.all_reduce(tensor)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            took = torch.tensor([time.perf_counter() - began], dtype=torch.float64, device=device)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)  # every process reports the slowest one's time
            return float(took.item())

        timed(payload, 1)  # connections, buffers
        seconds = timed(payload, args.iterations)
        latency = timed(tiny, 10) / 10
    finally:
        dist.destroy_process_group()
    n, size = args.nnodes * width, payload.numel() * 4
    algo = size * args.iterations / seconds
    return {
        "backend": args.backend,
        "device": devices[0] if width == 1 else f"{width} x {devices[0].split(':')[0]}",
        "processes": n,
        "bytes": size,
        "iterations": args.iterations,
        "seconds": round(seconds, 6),
        "algo_bytes_s": algo,
        "bus_bytes_s": algo * 2 * (n - 1) / n,  # nccl-tests' bus bandwidth: what each process's link carried
        "latency_s": latency,
    }


def finish(store: Any, args: argparse.Namespace, hosting: bool) -> None:
    """Every node says it is done; the host waits for all of them before its store goes away."""
    store.add("done", 1)
    if not hosting:
        return
    deadline = time.monotonic() + FINISH_WAIT_S
    while store.add("done", 0) < args.nnodes and time.monotonic() < deadline:
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--node-rank", type=int, required=True)
    parser.add_argument("--nnodes", type=int, required=True)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--devices", default="cpu", help="this node's drafter devices, comma-separated")
    parser.add_argument("--bytes", type=int, default=16 << 20)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--join-timeout", type=float, default=120.0)
    parser.add_argument("--plan", default="{}")
    parser.add_argument("--run-id", default="none")
    args = parser.parse_args()
    began = time.monotonic()
    deadline = began + args.join_timeout
    try:
        import torch.distributed as dist

        host, port = parse_endpoint(args.endpoint)
        root, hosting = open_store(host, port, args.join_timeout)
        store = dist.PrefixStore(f"dflash-doctor/link/{args.run_id}/", root)
        plans = join(store, args, deadline)
        joined = time.monotonic() - began
        differ = len({json.dumps(p, sort_keys=True) for p in plans.values()}) > 1
        link = None if differ else measure(args, max(30.0, args.join_timeout))
        finish(store, args, hosting)
    except SystemExit:
        raise
    except Exception as exc:
        emit({"error": "failed", "detail": f"{type(exc).__name__}: {exc}"[:600],
              "traceback": traceback.format_exc().splitlines()[-8:]}, 1)  # fmt: skip
    emit(
        {
            "hosting": hosting,
            "joined_s": round(joined, 3),
            "seconds": round(time.monotonic() - began, 3),
            "plans": {str(r): p for r, p in plans.items()},
            "link": link,
        },
        0,
    )


if __name__ == "__main__":
    main()
