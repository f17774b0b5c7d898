"""The link check between the nodes of a multi-node launch: runs INSIDE the audited interpreter, one per node,
and prints one JSON document on stdout.

Stdlib + torch only (the audited environment need not have dflash_doctor), runnable as a plain script:

    python link_child.py --endpoint HOST:PORT --node-rank R --nnodes N --backend gloo|nccl --device cpu|cuda:0
        --bytes B --iterations K --join-timeout S --plan JSON [--run-id ID]

Before torchrun starts, every node's launcher runs this child at the run's own rendezvous endpoint: the node
whose address it is hosts a store there (any other binding it is a client; on one host, the first to bind),
each node claims its rank, leaves what it will run (`--plan`) and waits for the others, so that a node given
another config, a rank taken twice or an endpoint nobody answers is known before any process is started. Then
one process per node joins a process group over the run's backend and device and times an all-reduce of
`--bytes` (`--iterations` of them, after one warm-up): the figure the run's gradient all-reduce (and any
hidden state crossing nodes) will move at. The host leaves last, so nobody loses the store mid-way; the port is
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
import socket
import sys
import time
import traceback
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


def measure(store: Any, args: argparse.Namespace, timeout_s: float) -> dict[str, Any]:
    """One process per node, the run's backend and device: a warm-up all-reduce, then `iterations` timed ones
    of `bytes` (the slowest node's time counts), and 10 one-element ones for the latency."""
    import torch
    import torch.distributed as dist

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        args.backend,
        store=dist.PrefixStore("pg/", store),
        rank=args.node_rank,
        world_size=args.nnodes,
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
            dist.all_reduce(took, op=dist.ReduceOp.MAX)  # every node reports the slowest node's time
            return float(took.item())

        timed(payload, 1)  # connections, buffers
        seconds = timed(payload, args.iterations)
        latency = timed(tiny, 10) / 10
    finally:
        dist.destroy_process_group()
    n, size = args.nnodes, payload.numel() * 4
    algo = size * args.iterations / seconds
    return {
        "backend": args.backend,
        "device": args.device,
        "bytes": size,
        "iterations": args.iterations,
        "seconds": round(seconds, 6),
        "algo_bytes_s": algo,
        "bus_bytes_s": algo * 2 * (n - 1) / n,  # nccl-tests' bus bandwidth: what each node's link carried
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
    parser.add_argument("--device", default="cpu")
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
        link = None if differ else measure(store, args, max(30.0, args.join_timeout))
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
