"""The gate's link check between nodes (issue 59), on one machine: `--nodes` children meet on localhost as the
nodes' launchers do (`dflash_doctor/launch/link.py`), `--rounds` times; how long each took (imports, the wait
for the others, the all-reduce) and what the link measured. On a multi-node machine, run the launch itself:
the gate's `launch.nodes` finding has the same figures (`seconds`, `link`).

    python3 -m bench.launch.link_check [--nodes 2] [--rounds 3] [--device-type cpu|cuda]

Prints a table; writes JSON (default bench/results/link_check.json).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dflash_base.atomic import write_json_atomic
from dflash_doctor.launch.link import LinkReport, LinkRequest, run_link_check


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_round(nodes: int, device_type: str) -> list[LinkReport]:
    endpoint = f"127.0.0.1:{free_port()}"
    reports: list[LinkReport | None] = [None] * nodes

    def node(rank: int) -> None:
        request = LinkRequest(endpoint, "--rdzv-endpoint", rank, nodes, device_type, {"same": True})
        reports[rank] = run_link_check(sys.executable, request)

    threads = [threading.Thread(target=node, args=(r,)) for r in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in reports if r is not None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device-type", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/link_check.json"))
    args = parser.parse_args()
    rows = []
    table = Table(
        title=f"link check, {args.nodes} nodes on localhost ({args.device_type})", title_justify="left"
    )
    for column in ("round", "child s (slowest)", "all joined s", "bus GB/s", "all-reduce s", "latency ms"):
        table.add_column(column)
    for index in range(args.rounds):
        reports = one_round(args.nodes, args.device_type)
        failed = [r.failure or str(r.error) for r in reports if r.link is None]
        if failed:
            raise SystemExit(f"round {index + 1}: {failed}")
        link = reports[0].link
        assert link is not None
        row = {
            "seconds": max(r.seconds for r in reports),
            "joined_s": max(r.joined_s for r in reports),
            "bus_bytes_s": link.bus_bytes_s,
            "all_reduce_s": link.seconds,
            "bytes": link.bytes,
            "iterations": link.iterations,
            "latency_s": link.latency_s,
        }
        rows.append(row)
        table.add_row(
            str(index + 1), f"{row['seconds']:.2f}", f"{row['joined_s']:.2f}", f"{link.bus_bytes_s / 1e9:.2f}",
            f"{link.seconds:.3f}", f"{link.latency_s * 1e3:.2f}",
        )  # fmt: skip
    console = Console()
    console.print(table)
    median = statistics.median(r["seconds"] for r in rows)
    console.print(f"median child: {median:.2f} s")
    write_json_atomic(args.out, {"nodes": args.nodes, "device_type": args.device_type, "rounds": rows})


if __name__ == "__main__":
    main()
