"""A launch of one process in all starts `python -m trainer` itself, without torchrun (issue 40 §2): the plan,
`--dry-run` and the record show that command; two processes, several nodes, a rendezvous or
`topology.launcher = "torchrun"` keep torchrun. Fast: nothing real is started here (tests/launch/test_direct_runs.py
runs the real thing)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_doctor.cli import run
from dflash_doctor.launch import lifecycle
from dflash_doctor.launch.direct import RANK_ENVIRON, rank_environ, starts_directly
from dflash_doctor.launch.runs import RunStore
from dflash_doctor.launch.supervise import TorchrunOutcome, run_torchrun
from tests.launch.test_train_gate import launches  # noqa: F401  (fixture)

ONE = ["--set", 'topology.mode="colocated"']  # tiny-cpu colocated on CPU: one rank, one process
TORCHRUN = ["--set", 'topology.launcher="torchrun"']


def dry_plan(*args: str, capsys: pytest.CaptureFixture[str]) -> dict:
    assert run(["train", "--config", "tiny-cpu", "--no-deep", "--dry-run", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)["plan"]


def test_one_process_starts_the_trainer_directly_and_two_start_torchrun(
    launches: list[list[str]],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    one = dry_plan(*ONE, capsys=capsys)
    assert one["launcher"] == "direct" and one["nproc_per_node"] == 1
    assert one["command"][1:5] == ["-m", "trainer", "--config", one["config_path"]]
    assert "torch.distributed.run" not in one["command"]
    assert {k: one["environ"][k] for k in RANK_ENVIRON} == RANK_ENVIRON  # shown with the plan
    two = dry_plan(capsys=capsys)  # tiny-cpu: 1 target + 1 drafter
    assert two["launcher"] == "torchrun" and two["nproc_per_node"] == 2
    assert two["command"][1:3] == ["-m", "torch.distributed.run"]
    assert "RANK" not in two["environ"]


def test_the_printed_command_is_the_one_started(
    launches: list[list[str]],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["train", "--config", "tiny-cpu", "--no-deep", *ONE]) == 0
    out = capsys.readouterr().out
    (started,) = launches
    assert started[1:3] == ["-m", "trainer"]
    assert "command: " in out and " -m trainer --config " in out and "torch.distributed.run" not in out
    assert "env: RANK=0" in out and "env: WORLD_SIZE=1" in out
    assert "before the rank: " in out
    (record,) = RunStore().all()
    assert record.command == started and record.plan["launcher"] == "direct"


def test_topology_launcher_torchrun_keeps_torchrun_for_one_process(
    launches: list[list[str]],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan = dry_plan(*ONE, *TORCHRUN, capsys=capsys)
    assert plan["launcher"] == "torchrun"
    assert plan["command"][1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]


def test_a_bad_launcher_value_is_a_config_error(
    launches: list[list[str]],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["train", "--config", "tiny-cpu", "--no-deep", "--set", 'topology.launcher="direct"']) == 2
    err = capsys.readouterr().err
    assert 'topology.launcher: must be one of "auto", "torchrun", got "direct"' in err
    assert launches == [] and RunStore().all() == []


@pytest.mark.parametrize(
    ("launcher", "nnodes", "standalone", "nproc", "world", "direct"),
    [
        ("auto", 1, True, 1, 1, True),
        ("torchrun", 1, True, 1, 1, False),  # forced
        ("auto", 1, True, 2, 2, False),  # two processes
        ("auto", 2, False, 1, 2, False),  # two nodes of one process each
        ("auto", 1, False, 1, 1, False),  # one node told to meet a rendezvous: torchrun does that
    ],
)
def test_only_one_process_on_one_standalone_node_starts_directly(
    launcher: str, nnodes: int, standalone: bool, nproc: int, world: int, direct: bool
) -> None:
    assert starts_directly(launcher, nnodes, standalone, nproc, world) is direct


def test_a_master_address_keeps_torchrun_for_one_process(
    launches: list[list[str]],  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan = dry_plan(*ONE, "--master-addr", "127.0.0.1", "--master-port", "29555", capsys=capsys)
    assert plan["launcher"] == "torchrun" and "--master-addr=127.0.0.1" in plan["command"]


def test_the_direct_rank_gets_torchruns_rank_variables_and_none_of_its_agents(
    launches: list[list[str]],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A launcher run inside another job (MASTER_ADDR, TORCHELASTIC_*, a stale RANK inherited): the lone rank
    must not point at that job's store, so the trainer joins its own (trainer/run/train.py)."""
    for key, value in {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234", "TORCHELASTIC_RUN_ID": "x"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("RANK", "7")
    seen: list[dict[str, str]] = []

    def fake(command: list[str], environ: dict[str, str], **kwargs: object) -> TorchrunOutcome:
        seen.append(environ)
        return TorchrunOutcome(0)

    monkeypatch.setattr(lifecycle, "run_torchrun", fake)
    assert run(["train", "--config", "tiny-cpu", "--no-deep", *ONE]) == 0
    (environ,) = seen
    assert {k: environ[k] for k in RANK_ENVIRON} == RANK_ENVIRON
    assert environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert not {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"} & environ.keys()
    assert environ["DFLASH_DOCTOR_TIMELINE"]  # the timeline still reaches the rank
    capsys.readouterr()


def test_rank_environ_keeps_what_is_not_torchruns() -> None:
    environ = rank_environ({"PATH": "/bin", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCHELASTIC_X": "1"})
    assert environ["PATH"] == "/bin" and environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert "TORCHELASTIC_X" not in environ and environ["WORLD_SIZE"] == "1"


def test_a_process_killed_by_a_signal_not_ours_exits_128_plus_n_and_names_it() -> None:
    """A lone rank killed outright (the OOM killer) leaves no traceback and no torchrun summary: the outcome
    must say what ended it."""
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    outcome = run_torchrun([sys.executable, "-c", kill], dict(os.environ))
    assert outcome.exit_code == 128 + signal.SIGKILL and not outcome.interrupted
    assert outcome.reason == "the launched process was killed by SIGKILL"


def test_a_world_of_one_without_master_addr_joins_a_group_of_its_own() -> None:
    """In a child (a process group is per process): no MASTER_ADDR, no port, a collective works."""
    code = (
        "import os, torch, torch.distributed as dist\n"
        "from datetime import timedelta\n"
        "from trainer.run.train import join_process_group\n"
        "join_process_group('gloo', timedelta(seconds=30), 1)\n"
        "t = torch.ones(1); dist.all_reduce(t); g = dist.new_group([0])\n"
        "print(dist.get_rank(), dist.get_world_size(), int(t.item()))\n"
        "dist.destroy_process_group()\n"
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "TORCHELASTIC_"))}
    environ.update(RANK_ENVIRON, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    done = subprocess.run(
        [sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "1", "1"]


def test_the_spawn_phase_is_named_for_what_started_the_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.__main__ import spawn_phase

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert spawn_phase() == "worker spawn"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert spawn_phase() == "torchrun start"
