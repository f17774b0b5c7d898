"""The drafter's floor (issue 56 §2): with `[eval] prompts`, `train` decodes the export once the run succeeded
and fails the run (exit 1, recorded, the export kept) when tau is below `eval.min_tau`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from dflash_base.errors import ConfigError
from dflash_doctor.cli import run
from dflash_doctor.launch import lifecycle
from dflash_doctor.launch.compile_cache import CachePreparation
from dflash_doctor.launch.floor import check_floor, floor_command, judge
from dflash_doctor.launch.runs import RunStore
from dflash_doctor.launch.supervise import TorchrunOutcome
from tests.trainer.eval.test_eval import PROMPTS, _untrained_drafter
from trainer.model.export import export_drafter
from trainer.runspec.config import load_config

REPORT = {"mean_accept_len": 2.5, "baseline": {"mean_accept_len": 1.5}, "lossless": {"off": 0}}


def test_the_verdict_is_tau_against_the_floor_and_no_token_off() -> None:
    passed = judge(REPORT, "p.jsonl", 2.0, 3.2)
    assert passed.passed and passed.tau == 2.5 and passed.baseline_tau == 1.5
    assert (
        passed.line() == "floor: tau 2.500 (prompt lookup 1.500) on p.jsonl in 3 s (eval.min_tau 2): passed"
    )
    below = judge(REPORT, "p.jsonl", 3.0, 3.2)
    assert not below.passed and below.problem == "tau 2.500 on p.jsonl is below eval.min_tau 3"
    off = judge(REPORT | {"lossless": {"off": 2}}, "p.jsonl", 0.0, 1.0)
    assert not off.passed and "2 emitted token(s) off the target's choice" in (off.problem or "")
    assert judge(REPORT, "p.jsonl", 0.0, 1.0).passed  # no floor set: decoded and recorded


def test_the_floor_decodes_as_the_run_was_configured(tmp_path: Path) -> None:
    command = floor_command("py", tmp_path / "export", tmp_path / "run.toml", ["run.seed=3"], "p.jsonl", 64)
    assert command[:4] == ["py", "-m", "dflash_doctor", "eval"]
    assert command[command.index("--set") + 1] == "run.seed=3"
    assert command[command.index("--latency") + 1] == "" and "--json" in command
    assert command[command.index("--max-new-tokens") + 1] == "64"


def test_a_decode_that_fails_is_the_floors_failure_named(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'Error: --export: cannot read it' >&2\nexit 2\n")
    fake.chmod(0o755)
    section = SimpleNamespace(prompts="p.jsonl", min_tau=1.0, max_new_tokens=8)
    result = check_floor(str(fake), tmp_path, tmp_path / "c.toml", [], section)
    assert not result.passed and result.tau is None
    assert result.problem == "eval exited 2: Error: --export: cannot read it"


def test_a_floor_without_prompts_and_prompts_that_are_not_a_prompts_file_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"eval.min_tau: a floor of 2 needs eval.prompts"):
        load_config("tiny-cpu", ["eval.min_tau=2"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_ids": [1, 99999]}\n')
    with pytest.raises(ConfigError, match=r"eval.prompts: .*bad.jsonl line 1: input_ids\[1\] is 99999"):
        load_config("tiny-cpu", [f"eval.prompts='{bad}'"])


@pytest.fixture
def launch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A tiny-cpu launch whose torchrun is a stand-in that succeeds, with an (untrained) export already in the
    output folder: what the floor decodes. Returns the output folder."""
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(lifecycle, "run_torchrun", lambda *a, **k: TorchrunOutcome(0))
    monkeypatch.setattr(
        lifecycle, "prepare_compile_cache", lambda *a, **k: CachePreparation("warm", "stub", 0.0)
    )
    export_drafter(_untrained_drafter(), tmp_path / "out" / "export")
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"input_ids": p}) + "\n" for p in PROMPTS))
    return tmp_path / "out"


def train(out: Path, *sets: str) -> int:
    argv = ["train", "--config", "tiny-cpu", "--no-deep", "--json", "--set", f"output.dir='{out}'"]
    argv += ["--set", f"eval.prompts='{out.parent / 'prompts.jsonl'}'", "--set", "eval.max_new_tokens=8"]
    for item in sets:
        argv += ["--set", item]
    return run(argv)


@pytest.mark.slow  # the eval child imports torch and transformers: ~40-70 s on a 2-core box
@pytest.mark.skipif(sys.platform != "linux", reason="runs the eval child in this interpreter")
def test_below_the_floor_the_run_fails_recorded_and_the_export_is_kept(
    launch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert train(launch, "eval.min_tau=3.5") == 1
    document = json.loads(capsys.readouterr().out)
    assert document["status"] == "failed"
    (record,) = [r.to_json() for r in RunStore().all()]
    assert record["status"] == "failed" and record["exit_code"] == 1
    assert record["floor"]["passed"] is False and 1.0 <= record["floor"]["tau"] < 3.5
    assert "is below eval.min_tau 3.5" in record["reason"]
    assert (launch / "export" / "model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="runs the eval child in this interpreter")
def test_at_the_floor_or_with_none_the_run_succeeds_and_records_tau(
    launch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert train(launch) == 0
    capsys.readouterr()
    (record,) = [r.to_json() for r in RunStore().all()]
    assert record["status"] == "succeeded" and record["floor"]["passed"] is True
    assert record["floor"]["tau"] >= 1.0 and record["floor"]["baseline_tau"] is not None
    assert any(note.startswith("floor: tau ") for note in record["notes"])
