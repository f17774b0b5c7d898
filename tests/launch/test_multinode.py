"""`train --nnodes 2 --node-rank R --rdzv-endpoint HOST:PORT` on CPU: two launchers on one host play two
nodes (gloo), each gating its own node with its own home (issue 59's command, `examples/multinode/cpu_two_nodes.sh`):
each node runs its own 2 targets + 1 drafter and no pair crosses nodes; a node killed outright stops the other,
both records closed with the cause; nodes given different plans are refused on both before anything starts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests.trainer.trainer_runs import REPO, environment

# very short, with nothing to compile in the launcher's CPU warm-up
SHORT = [
    "optim.steps=6",
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


def start_nodes(
    tmp_path: Path,
    overrides: list[str],
    per_node: tuple[list[str], list[str]] = ([], []),
    shared_output: bool = False,
    config: str = "tiny-cpu",
    options: list[str] | None = None,
) -> list[subprocess.Popen[str]]:
    """Both launchers started at once, each in a session of its own; `per_node`: further `--set` items for
    node 0 and node 1. Each "node" has its own home and its own output folder (its disk), unless
    `shared_output` (a shared filesystem: one folder, each launcher holding its own node rank's lock)."""
    port = free_port()
    procs = []
    for node in (0, 1):
        out = tmp_path / ("out" if node == 0 or shared_output else f"out-node{node}")
        sets = [*SHORT, *overrides, *per_node[node], f"output.dir={json.dumps(str(out))}"]
        env = {**environment(), "DFLASH_DOCTOR_HOME": str(tmp_path / f"home{node}")}
        command = [
            sys.executable, "-m", "dflash_doctor", "train", "--config", config, "--no-deep",
            "--nnodes", "2", "--node-rank", str(node), "--rdzv-endpoint", f"127.0.0.1:{port}", *(options or []),
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
    return procs


def finish(procs: list[subprocess.Popen[str]], timeout: float = 600) -> list[tuple[int, str]]:
    """(exit code, output) per node. Every process is reaped."""
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


def two_nodes(
    tmp_path: Path, overrides: list[str], timeout: float = 600, **kw: object
) -> list[tuple[int, str]]:
    return finish(start_nodes(tmp_path, overrides, **kw), timeout)  # type: ignore[arg-type]


def processes_of(tmp_path: Path) -> list[str]:
    """Processes still running whose command line names `tmp_path` (a launcher, torchrun, a worker, a warden)."""
    left = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if (
            str(tmp_path) in cmdline
            and proc.pid != os.getpid()
            and proc.info["status"] != psutil.STATUS_ZOMBIE
        ):
            left.append(f"{proc.pid}: {cmdline[:200]}")
    return left


def metrics(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def records(tmp_path: Path, node: int) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((tmp_path / f"home{node}").rglob("runs/*/record.json"))]


def test_two_nodes_of_two_targets_and_a_drafter_train_and_no_pair_crosses(tmp_path: Path) -> None:
    """The issue's command: `tiny-cpu-2t1d` on each of two nodes (4 targets + 2 drafters in all): both exit 0,
    the drafter learns, every batch stays on its node, the gate met the other node and measured the link."""
    began = time.monotonic()
    results = two_nodes(tmp_path, [], config="tiny-cpu-2t1d")
    took = time.monotonic() - began
    for node, (code, out) in enumerate(results):
        assert code == 0, f"node {node}:\n{out[-4000:]}"
        text = " ".join(out.split())
        assert "--nproc-per-node=3" in text and f"--node-rank={node}" in text
        assert "(2 + 1 on each of 2 nodes)" in text and "none crosses nodes" in text
        assert "2 nodes agree and met in" in text and "GB/s all-reduce bus bandwidth" in text
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())  # the first drafter: rank 2, node 0
    assert summary["status"] == "ok"
    assert summary["topology"]["nodes"] == 2 and summary["topology"]["placement"] == "node"
    pairs = {(p["target_rank"], p["drafter_rank"]) for p in summary["topology"]["pairs"]}
    assert pairs == {(0, 2), (1, 2), (3, 5), (4, 5)}
    assert all(p["target_node"] == p["drafter_node"] for p in summary["topology"]["pairs"])
    losses = [m["loss"] for m in metrics(tmp_path / "out")]
    assert len(losses) == 6 and losses[-1] < losses[0] - 1.0, losses  # 10.3 -> 7.6 on this box
    for node in (0, 1):
        [record] = records(tmp_path, node)
        assert record["status"] == "succeeded" and f"node rank {node} of 2" in record["notes"]
        link = next(f for f in record["findings"] if f["id"] == "launch.nodes")
        assert link["evidence"]["link"]["crossing_bytes"] == 0 and link["evidence"]["link"]["drafters"] == 2
    print(f"two CPU nodes, 2+1 each, 6 steps: {took:.1f} s")


def test_colocated_over_two_nodes(tmp_path: Path) -> None:
    # One output folder for both nodes (a shared filesystem): each launcher locks its own node rank.
    results = two_nodes(tmp_path, ['topology.mode="colocated"', "optim.steps=4"], shared_output=True)
    for node, (code, out) in enumerate(results):
        assert code == 0, f"node {node}:\n{out[-4000:]}"
        text = " ".join(out.split())
        assert "launch topology" in text and "2 colocated ranks" in text  # each launcher gated its node
        assert "--nnodes=2" in text and f"--node-rank={node}" in text
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "ok"
    assert summary["topology"].items() >= {"mode": "colocated", "targets": 2, "drafters": 2}.items()
    losses = [m["loss"] for m in metrics(tmp_path / "out")]
    assert len(losses) == 4 and losses[-1] < losses[0]


@pytest.mark.slow
def test_one_list_over_two_nodes_crosses_and_the_gate_counts_the_hidden_states(tmp_path: Path) -> None:
    """`topology.placement = "world"`: the target on node 0, the drafter on node 1, every batch across."""
    results = two_nodes(tmp_path, ['topology.mode="split"', 'topology.placement="world"', "optim.steps=4"])
    for node, (code, out) in enumerate(results):
        assert code == 0, f"node {node}:\n{out[-4000:]}"
        assert "1 of 1 target -> drafter pairs cross nodes" in " ".join(out.split())
    assert "rank 0 (target)" in results[0][1] and "rank 1 (drafter)" in results[1][1]
    summary = json.loads((tmp_path / "out-node1" / "summary.json").read_text())  # the drafter's node
    assert summary["topology"]["pairs"] == [
        {"target_rank": 0, "drafter_rank": 1, "target_node": 0, "drafter_node": 1}
    ]
    [record] = records(tmp_path, 0)
    link = next(f for f in record["findings"] if f["id"] == "launch.nodes")["evidence"]["link"]
    assert link["crossing_batches_per_step"] == 1.0 and link["crossing_bytes"] == link["batch_bytes"] > 0


@pytest.mark.slow
def test_two_colocated_processes_on_each_of_two_nodes(tmp_path: Path) -> None:
    results = two_nodes(tmp_path, ['topology.mode="colocated"', "topology.ranks=4", "optim.steps=4"])
    for node, (code, out) in enumerate(results):
        assert code == 0, f"node {node}:\n{out[-4000:]}"
        assert "--nproc-per-node=2" in " ".join(out.split())
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["topology"].items() >= {"mode": "colocated", "targets": 4, "drafters": 4}.items()


@pytest.mark.slow
@pytest.mark.parametrize("killed", [0, 1])
def test_a_node_killed_outright_stops_the_other_and_both_records_say_why(tmp_path: Path, killed: int) -> None:
    """SIGKILL to one node's launcher mid-run (node 0 holds the first drafter, its metrics and checkpoints):
    the other node stops within seconds, both records end `failed` with the cause (the survivor's: a lost
    peer; the killed one's, closed by its warden: its launcher killed), every checkpoint loads whole, and no
    process of either node is left."""
    overrides = ["optim.steps=400", "checkpoint.every=2", "checkpoint.keep=2"]
    procs = start_nodes(tmp_path, overrides, config="tiny-cpu-2t1d")
    try:
        deadline = time.monotonic() + 300
        while len(metrics(tmp_path / "out")) < 5:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "no steps"
            time.sleep(0.2)
        os.kill(procs[killed].pid, signal.SIGKILL)
        killed_at = time.monotonic()
        survivor = procs[1 - killed]
        out, _ = survivor.communicate(timeout=120)
        stopped_s = time.monotonic() - killed_at
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
            proc.wait()
    assert survivor.returncode == 1, out[-4000:]
    assert stopped_s < 60, f"the surviving node took {stopped_s:.1f} s to stop"
    [alive] = records(tmp_path, 1 - killed)
    assert alive["status"] == "failed" and "lost a peer of this run" in (alive["reason"] or ""), alive[
        "reason"
    ]
    deadline = time.monotonic() + 90  # the warden waits for its node's torchrun to stop its workers
    while (dead := records(tmp_path, killed)[0])["status"] == "running":
        assert time.monotonic() < deadline, "the killed node's record is still running"
        time.sleep(0.5)
    assert dead["status"] == "failed" and "was killed before it could close this record" in dead["reason"]
    for folder in (tmp_path / "out" / "checkpoints").iterdir():  # the first drafter's, on node 0
        assert folder.name.startswith("step_"), f"left over: {folder.name}"
        assert json.loads((folder / "meta.json").read_text())["step"] == int(folder.name.split("_")[1])
        torch.load(folder / "state.pt", weights_only=False)
    deadline = time.monotonic() + 30
    while processes_of(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_of(tmp_path) == []
    print(f"node {killed} killed: node {1 - killed} stopped in {stopped_s:.1f} s")


def test_nodes_given_different_configs_are_refused_on_both_before_anything_starts(tmp_path: Path) -> None:
    """Node 1 given another step count and another split: each gate meets the other's plan at the endpoint
    and refuses, naming every field that differs; nothing is started on either node."""
    results = two_nodes(
        tmp_path,
        ["run.timeout_s=600"],
        per_node=([], ["optim.steps=8", "topology.drafters=2"]),
        config="tiny-cpu-2t1d",
    )
    for node, (code, out) in enumerate(results):
        text = " ".join(out.split())
        assert code == 1, f"node {node}:\n{out[-4000:]}"
        assert "the 2 nodes would run different plans" in text, f"node {node}:\n{out[-4000:]}"
        assert "optim.steps: node 0 6, node 1 8" in text
        assert "topology: node 0 split 4+2 (node), node 1 split 4+4 (node)" in text
        assert "launch refused" in text and "Nothing was started" in text
        [record] = records(tmp_path, node)
        assert record["status"] == "refused"
    assert metrics(tmp_path / "out") == [] and not (tmp_path / "out-node1").exists()
    assert processes_of(tmp_path) == []


@pytest.mark.slow
def test_forced_past_the_gate_nodes_on_different_topologies_stop_at_their_first_collective(
    tmp_path: Path,
) -> None:
    """The trainer's own check, for nodes that launch anyway (--force) or a bare torchrun: node 0 colocated,
    node 1 one list of 1+1 (both world size 2), every rank stops before any step, naming what each node runs."""
    began = time.monotonic()
    results = two_nodes(
        tmp_path,
        ["run.timeout_s=600"],  # a hang would last this long: the check must not wait on it
        per_node=(['topology.mode="colocated"'], ['topology.mode="split"', 'topology.placement="world"']),
        shared_output=True,
        options=["--force"],
    )
    took = time.monotonic() - began
    for node, (code, out) in enumerate(results):
        text = " ".join(out.split())
        assert code == 1, f"node {node}:\n{out[-4000:]}"  # the run failed: recorded, nothing hung
        assert "the nodes of this run disagree on the topology" in text, f"node {node}:\n{out[-4000:]}"
        assert (
            "node 0 (rank 0): colocated on 2 ranks" in text
            and "node 1 (rank 1): split 1+1 over the world" in text
        )
        assert 'topology.mode="colocated"' in text  # the fix
    assert took < 300, f"took {took:.0f} s"
    assert processes_of(tmp_path) == []
    assert not (tmp_path / "out" / "metrics.jsonl").exists()  # no step ran


@pytest.mark.slow
def test_nodes_that_chose_different_sizes_fail_fast_naming_the_likely_cause(tmp_path: Path) -> None:
    """Colocated 2 on node 0 (1 process) and colocated 4 on node 1 (2 processes), forced past the gate:
    torchrun starts 3, which fits neither, so every rank stops before the process group forms, the hint
    naming the nodes' choice."""
    results = two_nodes(
        tmp_path,
        ["run.timeout_s=600", 'topology.mode="colocated"'],
        per_node=(["topology.ranks=2"], ["topology.ranks=4"]),
        shared_output=True,
        timeout=300,
        options=["--force"],
    )
    for node, (code, out) in enumerate(results):
        text = " ".join(out.split())
        assert code == 1, f"node {node}:\n{out[-4000:]}"
        assert "but torchrun started 3 processes" in text, f"node {node}:\n{out[-4000:]}"
        assert "with 2 nodes, they likely chose different topologies" in text
    assert processes_of(tmp_path) == []
