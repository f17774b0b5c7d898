"""`train --nnodes 2 --node-rank R --rdzv-endpoint HOST:PORT` on CPU: two launchers on one host play two
nodes (gloo), each gating its own node with its own home, for both topologies."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.trainer.trainer_runs import REPO, environment

# tiny-cpu, very short, with nothing to compile in the launcher's CPU warm-up
SHORT = [
    "optim.steps=4",
    "data.seq_len=64",
    "data.num_samples=64",
    "optim.batch_size=4",
    "optim.anchors=16",
    "run.log_every=1",
    "run.timeout_s=120",
    "drafter.compile_loss=false",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def two_nodes(
    tmp_path: Path,
    overrides: list[str],
    timeout: float = 600,
    per_node: tuple[list[str], list[str]] = ([], []),
    shared_output: bool = False,
) -> list[tuple[int, str]]:
    """Start both launchers at once; (exit code, output) per node. Every process is reaped.

    `per_node`: further `--set` items for node 0 and node 1. Each "node" has its own home; its output
    folder is its own disk's (node 0's holds the run's files) unless `shared_output` (a shared filesystem:
    one folder, each launcher holding its own node rank's lock)."""
    port = free_port()
    procs = []
    for node in (0, 1):
        out = tmp_path / ("out" if node == 0 or shared_output else f"out-node{node}")
        sets = [*SHORT, *overrides, *per_node[node], f"output.dir={json.dumps(str(out))}"]
        env = {**environment(), "DFLASH_DOCTOR_HOME": str(tmp_path / f"home{node}")}
        command = [
            sys.executable, "-m", "dflash_doctor", "train", "--config", "tiny-cpu", "--no-deep",
            "--nnodes", "2", "--node-rank", str(node), "--rdzv-endpoint", f"127.0.0.1:{port}",
            *[arg for item in sets for arg in ("--set", item)],
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(
                command,
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    results = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            results.append((proc.returncode, out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    return results


def processes_of(tmp_path: Path) -> list[str]:
    """Processes still running whose command line names `tmp_path` (a launcher, torchrun, a worker)."""
    left = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(tmp_path) in cmdline and proc.pid != os.getpid():
            left.append(f"{proc.pid}: {cmdline[:200]}")
    return left


def metrics(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]


def test_colocated_over_two_nodes(tmp_path: Path) -> None:
    # One output folder for both nodes (a shared filesystem): each launcher locks its own node rank.
    results = two_nodes(tmp_path, ['topology.mode="colocated"'], shared_output=True)
    for node, (code, out) in enumerate(results):
        assert code == 0, f"node {node}:\n{out[-4000:]}"
        text = " ".join(out.split())
        assert "launch topology" in text and "2 colocated ranks" in text  # each launcher gated its node
        assert "--nnodes=2" in text and f"--node-rank={node}" in text
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["topology"] == {
        "mode": "colocated",
        "targets": 2,
        "drafters": 2,
    }
    losses = [m["loss"] for m in metrics(tmp_path)]
    assert len(losses) == 4 and losses[-1] < losses[0]


@pytest.mark.slow
def test_split_over_two_nodes(tmp_path: Path) -> None:
    results = two_nodes(tmp_path, ['topology.mode="split"'])  # target on node 0, drafter on node 1
    for node, (code, out) in enumerate(results):
        assert code == 0, f"node {node}:\n{out[-4000:]}"
    assert "rank 0 (target)" in results[0][1] and "rank 1 (drafter)" in results[1][1]
    summary = json.loads((tmp_path / "out-node1" / "summary.json").read_text())  # the drafter's node
    assert summary["topology"] == {"mode": "split", "targets": 1, "drafters": 1}


@pytest.mark.slow
def test_two_colocated_processes_on_each_of_two_nodes(tmp_path: Path) -> None:
    results = two_nodes(tmp_path, ['topology.mode="colocated"', "topology.ranks=4"])
    for node, (code, out) in enumerate(results):
        assert code == 0, f"node {node}:\n{out[-4000:]}"
        assert "--nproc-per-node=2" in " ".join(out.split())
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["topology"] == {"mode": "colocated", "targets": 4, "drafters": 4}


def test_nodes_that_chose_different_topologies_fail_fast_with_one_message(tmp_path: Path) -> None:
    """Node 0 runs colocated, node 1 a split (as `auto` might pick on nodes whose free memory differs):
    both world size 2, so torchrun starts them; every rank stops at its first collective, naming what
    each node runs, instead of hanging in mismatched groups until run.timeout_s."""
    began = time.monotonic()
    results = two_nodes(
        tmp_path,
        ["run.timeout_s=600"],  # a hang would last this long: the check must not wait on it
        per_node=(['topology.mode="colocated"'], ['topology.mode="split"']),
        shared_output=True,
    )
    took = time.monotonic() - began
    for node, (code, out) in enumerate(results):
        text = " ".join(out.split())
        assert code == 1, f"node {node}:\n{out[-4000:]}"  # the run failed: recorded, nothing hung
        assert "the nodes of this run disagree on the topology" in text, f"node {node}:\n{out[-4000:]}"
        assert "node 0 (rank 0): colocated on 2 ranks" in text and "node 1 (rank 1): split 1+1" in text
        assert 'topology.mode="colocated"' in text  # the fix
    assert took < 300, f"took {took:.0f} s"
    assert processes_of(tmp_path) == []
    assert not (tmp_path / "out" / "metrics.jsonl").exists()  # no step ran


@pytest.mark.slow
def test_nodes_that_chose_different_sizes_fail_fast_naming_the_likely_cause(tmp_path: Path) -> None:
    """Colocated 2 on node 0 (1 process) and colocated 4 on node 1 (2 processes): torchrun starts 3, which
    fits neither, so every rank stops before the process group forms, the hint naming the nodes' choice."""
    results = two_nodes(
        tmp_path,
        ["run.timeout_s=600", 'topology.mode="colocated"'],
        per_node=(["topology.ranks=2"], ["topology.ranks=4"]),
        shared_output=True,
        timeout=300,
    )
    for node, (code, out) in enumerate(results):
        text = " ".join(out.split())
        assert code == 1, f"node {node}:\n{out[-4000:]}"
        assert "but torchrun started 3 processes" in text, f"node {node}:\n{out[-4000:]}"
        assert "with 2 nodes, they likely chose different topologies" in text
    assert processes_of(tmp_path) == []
