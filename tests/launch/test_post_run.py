"""After torchrun ends (issue 40 §2: both H200 launches of S12 exited 3 about 25 s after their first step):
the launcher's own bookkeeping (the run's outputs read back, the compile-cache snapshot) never turns a run
that succeeded into a crash, and whatever fails there, the run record is closed (never left `running`)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from dflash_doctor.cli import run
from dflash_doctor.launch import compile_cache, lifecycle
from dflash_doctor.launch.compile_cache import CachePreparation
from dflash_doctor.launch.runs import RunStore
from dflash_doctor.launch.supervise import TorchrunOutcome


@pytest.fixture
def launch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A tiny-cpu launch whose torchrun is a stand-in that succeeds; the real snapshot after it. Returns the
    run's output folder."""
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    for name in ("TORCHDYNAMO_SUPPRESS_ERRORS", "TORCHINDUCTOR_FORCE_DISABLE_CACHES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(lifecycle, "run_torchrun", lambda *a, **k: TorchrunOutcome(0))
    monkeypatch.setattr(
        lifecycle, "prepare_compile_cache", lambda *a, **k: CachePreparation("warm", "stub", 0.0)
    )
    return tmp_path / "out"


def train(out: Path) -> int:
    return run(["train", "--config", "tiny-cpu", "--no-deep", "--json", "--set", f"output.dir='{out}'"])


def only_record() -> dict:
    records = RunStore().all()
    assert len(records) == 1
    return records[0].to_json()


def test_a_snapshot_the_disk_cannot_take_is_a_note_and_the_run_succeeded(
    launch: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def full_disk(*args: object, **kwargs: object) -> object:
        raise OSError(errno.ENOSPC, "No space left on device", "/state/cache/snapshots/train-x.tar.zst")

    monkeypatch.setattr(compile_cache, "take_snapshot", full_disk)
    assert train(launch) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["status"] == "succeeded"
    record = only_record()
    assert record["status"] == "succeeded"
    assert record["snapshot"] == (
        "no snapshot: /state/cache/snapshots/train-x.tar.zst: No space left on device"
    )
    assert record["snapshot"] in record["notes"]


def test_a_bug_in_the_bookkeeping_after_the_run_stays_loud_but_the_record_is_closed(
    launch: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def bug(*args: object, **kwargs: object) -> str:
        raise ValueError("a bug of ours")

    monkeypatch.setattr(lifecycle, "snapshot_after_success", bug)
    assert train(launch) == 3  # a bug of ours: not swallowed
    assert "internal error: ValueError: a bug of ours" in capsys.readouterr().err
    record = only_record()
    assert record["status"] == "succeeded"  # the run itself: as torchrun said
    assert record["exit_code"] == 0 and record["finished"] is not None
    assert "after the run, the launcher failed: ValueError: a bug of ours" in record["notes"]
    assert record["timeline"]["phases"]  # what it knew of the launch is kept too


def test_a_failing_read_of_the_outputs_still_closes_a_failed_run(
    launch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lifecycle, "run_torchrun", lambda *a, **k: TorchrunOutcome(1, reason="rank 0: boom"))

    def unreadable(*args: object, **kwargs: object) -> dict:
        raise RuntimeError("metrics reader broke")

    monkeypatch.setattr(lifecycle, "last_metrics", unreadable)
    assert train(launch) == 3
    record = only_record()
    assert record["status"] == "failed" and record["exit_code"] == 1
    assert "after the run, the launcher failed: RuntimeError: metrics reader broke" in record["notes"]
