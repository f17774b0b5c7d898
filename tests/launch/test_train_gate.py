"""`dflash-doctor train`: each planted failure blocks the launch (exit 1, nothing started, a refusal
record); `--force` launches over it and the record names the override."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_doctor.cli import run
from dflash_doctor.env import gpus as gpus_module
from dflash_doctor.env.gpus import GpuInventory
from dflash_doctor.launch import gate as gate_module  # where the gate runs the link check between nodes
from dflash_doctor.launch import lifecycle as train_command  # where the launch runs torchrun
from dflash_doctor.launch.link import Link, LinkReport, LinkRequest
from dflash_doctor.launch.lone_rank import SEPARATE_ENV
from dflash_doctor.launch.runs import RunStore
from dflash_doctor.launch.supervise import TorchrunOutcome
from tests.fakeenv import FakeSite, make_venv
from tests.launch.test_launch_checks import h200
from tests.libs_fixtures import cuda_libs, install_cuda_torch  # noqa: F401  (fixture)


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[list[str]]:
    """Record launches instead of starting torchrun; isolate the tool's state in tmp, and the shipped
    configs' relative `output.dir` too (the launch locks it: never the repository's own runs/ folder)."""
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    for name in ("TORCHDYNAMO_SUPPRESS_ERRORS", "TORCHINDUCTOR_FORCE_DISABLE_CACHES"):
        monkeypatch.delenv(name, raising=False)
    # A lone rank is started beside the gate by the launcher itself, not through run_torchrun: here it keeps
    # the separate warm-up (stubbed below), so nothing real starts (tests/launch/test_lone_rank.py covers it).
    monkeypatch.setenv(SEPARATE_ENV, "1")
    started: list[list[str]] = []

    def fake_torchrun(command: list[str], environ: dict[str, str], **kwargs: object) -> TorchrunOutcome:
        started.append(command)
        return TorchrunOutcome(0)

    monkeypatch.setattr(train_command, "run_torchrun", fake_torchrun)
    monkeypatch.setattr(gate_module, "run_link_check", agreeing_link_check)  # no other node comes here
    monkeypatch.setattr(train_command, "prepare_compile_cache", lambda *a, **k: train_command_prep())
    monkeypatch.setattr(train_command, "snapshot_after_success", lambda *a, **k: "snapshot skipped in test")
    return started


def agreeing_link_check(interpreter: str, request: LinkRequest, cancel: object = None) -> LinkReport:
    """A multi-node launch's link check as if every node came, ran the same plan, over a 1 TB/s link."""
    link = Link("gloo", "cpu", 1 << 20, 1, 1e-6, 1e12, 1e-6)
    return LinkReport({rank: request.plan for rank in range(request.nnodes)}, link)


def train_command_prep():  # a stand-in for the cache preparation (tested in tests/cache)
    from dflash_doctor.launch.compile_cache import CachePreparation

    return CachePreparation("warm", "test", 0.0)


def only_record() -> dict:
    records = RunStore().all()
    assert len(records) == 1
    return records[0].to_json()


def test_healthy_tiny_config_passes_the_gate_and_launches(launches: list[list[str]], capsys) -> None:
    assert run(["train", "--config", "tiny-cpu", "--no-deep"]) == 0
    assert len(launches) == 1 and "torch.distributed.run" in launches[0]
    record = only_record()
    assert record["status"] == "succeeded" and record["forced_findings"] == []
    assert record["environment"]["schema"].startswith("dflash-doctor/lock")
    # the launcher's share of time to first step, on screen and in the record
    assert "before torchrun: " in capsys.readouterr().out
    assert any(n.startswith("before torchrun: ") and "gate " in n for n in record["notes"])


def test_dry_run_starts_nothing_and_prints_the_plan(launches: list[list[str]], capsys) -> None:
    assert run(["train", "--config", "tiny-cpu", "--no-deep", "--dry-run", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["role"] for r in report["plan"]["roles"]] == ["target", "drafter"]
    assert report["mask_token"] == {
        "id": 511,
        "text": None,
        "rule": "the embedded tiny target's last id (it has no tokenizer)",
    }
    assert launches == [] and RunStore().all() == []
    assert run(["train", "--config", "qwen3-8b-b16", "--no-deep", "--dry-run"]) in (0, 1)
    out = " ".join(capsys.readouterr().out.split())  # rich wraps at the terminal width
    assert "mask token: 151669 (a row no token uses), chosen by the published value for Qwen3" in out


def test_hazard_variable_blocks_then_force_overrides(launches, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TORCHDYNAMO_SUPPRESS_ERRORS", "1")
    assert run(["train", "--config", "tiny-cpu", "--no-deep"]) == 1
    assert launches == []
    refused = only_record()
    assert refused["status"] == "refused"
    assert any(f["id"].startswith("hazards.") and f["severity"] == "fail" for f in refused["findings"])
    assert run(["train", "--config", "tiny-cpu", "--no-deep", "--force"]) == 0
    assert len(launches) == 1
    forced = RunStore().all()[-1]
    assert forced.status == "succeeded"
    assert any(o.startswith("hazards.") for o in forced.forced_findings)


def test_topology_bigger_than_the_gpus_blocks(launches, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(
        gpus_module, "probe_gpus", lambda: GpuInventory("580.159.04", 13000, [h200(0), h200(1)])
    )
    code = run(
        [
            "train",
            "--config",
            "tiny-cpu",
            "--no-deep",
            "--set",
            "run.device='cuda'",
            "--set",
            "topology.targets=5",
            "--set",
            "topology.drafters=3",
        ]
    )
    assert code == 1 and launches == []
    assert "launch.topology.too_few_gpus" in {f["id"] for f in only_record()["findings"]}


def test_memory_plan_over_budget_blocks(launches) -> None:
    code = run(
        [
            "train",
            "--config",
            "tiny-cpu",
            "--no-deep",
            "--set",
            "target.path='random:qwen3-8b'",
            "--set",
            "data.kind='random'",
            "--set",
            "drafter.layers=5",
            "--set",
            "data.seq_len=3072",
            "--set",
            "optim.anchors=512",
            "--set",
            "drafter.block_size=16",
        ]
    )
    assert code == 1 and launches == []
    failing = {f["id"] for f in only_record()["findings"] if f["severity"] == "fail"}
    assert "launch.memory.over_budget" in failing


def test_missing_soname_in_another_interpreter_blocks(launches, tmp_path, cuda_libs) -> None:  # noqa: F811
    site = FakeSite(make_venv(tmp_path / "venv"))
    install_cuda_torch(site, cuda_libs, without=("nvidia-cudnn-cu13",))
    python = str(tmp_path / "venv" / "bin" / "python")
    assert run(["train", "--config", "tiny-cpu", "--no-deep", "--python", python]) == 1
    assert launches == []
    failing = {f["id"] for f in only_record()["findings"] if f["severity"] == "fail"}
    assert "libs.missing" in failing


def test_bad_config_is_exit_2_and_starts_nothing(launches, tmp_path, capsys) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[drafter]\nblock_size = "sixteen"\n')
    assert run(["train", "--config", str(bad)]) == 2
    assert "drafter.block_size" in capsys.readouterr().err
    assert launches == [] and RunStore().all() == []


def test_a_bad_data_workers_value_is_exit_2_naming_it(launches, capsys) -> None:
    assert run(["train", "--config", "tiny-cpu", "--no-deep", "--set", "data.workers=-2"]) == 2
    assert 'data.workers: must be "auto" or an integer >= 0 <= 64, got -2' in capsys.readouterr().err
    assert launches == []


def test_overrides_reach_the_workers(launches: list[list[str]]) -> None:
    assert run(["train", "--config", "tiny-cpu", "--no-deep", "--set", "optim.steps=7"]) == 0
    command = launches[0]
    # the user's overrides, then the topology the gate resolved (tiny-cpu: the 1+1 split it names)
    assert command[-8:-6] == ["--set", "optim.steps=7"]
    assert command[-6:] == [
        "--set", 'topology.mode="split"', "--set", "topology.targets=1", "--set", "topology.drafters=1",
    ]  # fmt: skip


def test_dry_run_on_eight_gpus_prints_the_recommended_split(launches, monkeypatch, capsys) -> None:
    monkeypatch.setattr(
        gpus_module, "probe_gpus", lambda: GpuInventory("580.159.04", 13000, [h200(i) for i in range(8)])
    )
    code = run(["train", "--config", "qwen3-8b-5t3d", "--no-deep", "--dry-run"])
    out = capsys.readouterr().out
    assert "recommended split" in out and "on 8 GPUs" in out
    assert launches == [] and code in (0, 1)


def test_broken_torch_in_the_tools_own_interpreter_is_a_message_not_a_traceback(
    launches, monkeypatch, capsys
) -> None:
    import builtins

    real_import = builtins.__import__

    def broken(name, *args, **kwargs):
        if name.startswith("trainer"):
            raise ImportError("libcudnn.so.9: cannot open shared object file: No such file or directory")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", broken)
    assert run(["train", "--config", "tiny-cpu", "--no-deep"]) == 2
    err = capsys.readouterr().err
    assert "libcudnn.so.9" in err and "dflash-doctor check --python" in err
    assert launches == []


def test_the_gates_deep_probe_keeps_its_flex_proof_in_a_folder_of_its_own(
    launches: list[list[str]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`check --deep` compiles its proof afresh; the gate before a launch reuses a persistent probe folder."""
    from dflash_doctor.deep.run import CACHE_ENV
    from dflash_doctor.launch import gate

    seen: list[object] = []
    real_run_checks = gate.run_checks

    def spy(ctx, **kwargs):  # type: ignore[no-untyped-def]  # kwargs: the gate defers the probe's judges
        seen.append(ctx.options.extra.get("deep_inductor_cache"))
        return real_run_checks(ctx, **kwargs)

    monkeypatch.setattr(gate, "run_checks", spy)
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert run(["train", "--config", "tiny-cpu", "--no-deep", "--dry-run"]) == 0
    assert seen[-1] == str(tmp_path / "home" / "cache" / "probe-inductor")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert run(["train", "--config", "tiny-cpu", "--no-deep", "--dry-run"]) == 0
    assert seen[-1] == str(tmp_path / "mine")
