"""A full disk while the trainer writes: the checkpoint, the export, metrics.jsonl, summary.json. Each is one
NoSpace naming the file and the bytes it needed, nothing partial is left, and what was written before (the
last good checkpoint, an earlier export) is untouched. On a real small tmpfs where mounting is permitted."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

from dflash_base.disk import NoSpace, size_text, writing
from tests.disk_fixtures import fill, small_disk  # noqa: F401  (fixture)
from tests.trainer.drafter_fixtures import tiny_drafter
from trainer.model.export import export_drafter, load_drafter
from trainer.run import checkpoint as ckpt
from trainer.run import metrics as metrics_module
from trainer.run.metrics import MetricsLog, StepMetrics, write_summary
from trainer.runspec.outputs import read_metrics


def state_of(kilobytes: int, step: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((kilobytes * 256,), float(step))}  # 4 bytes a value


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*") if p.name.startswith(".") and ".tmp" in p.name]


def test_a_checkpoint_that_cannot_fit_is_refused_before_a_byte_is_written(small_disk) -> None:  # noqa: F811
    out = small_disk(1024)
    first = ckpt.save_checkpoint(out, 10, state_of(300, 10), {"next_batch": 10}, keep=2)
    with pytest.raises(NoSpace) as caught:
        ckpt.save_checkpoint(out, 20, state_of(900, 20), {"next_batch": 20}, keep=2)
    error = caught.value
    assert error.path == str(out / "checkpoints" / "step_00000020")
    assert error.needed is not None and error.needed > 900 * 1024 and error.free is not None
    assert f"needs {size_text(error.needed)}" in error.message and str(out) in error.message
    assert leftovers(out) == [] and [s for s, _ in ckpt.list_checkpoints(out)] == [10]
    assert torch.equal(ckpt.load_checkpoint(first)["w"], state_of(300, 10)["w"])  # the last good one, whole


def test_a_disk_that_fills_during_the_write_is_named_and_the_partial_folder_removed(
    small_disk,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch.save itself fails ("basic_ios::clear: iostream error", "unexpected pos"): not an OSError."""
    out = small_disk(1024)
    ckpt.save_checkpoint(out, 10, state_of(300, 10), {"next_batch": 10}, keep=2)
    monkeypatch.setattr(ckpt, "require_space", lambda path, needed: None)  # the check passed; then it filled
    with pytest.raises(NoSpace) as caught:
        ckpt.save_checkpoint(out, 20, state_of(900, 20), {"next_batch": 20}, keep=2)
    assert not isinstance(caught.value.__cause__, OSError)  # torch's own error, diagnosed by the free space
    assert caught.value.path.endswith("step_00000020")
    assert leftovers(out) == [] and [s for s, _ in ckpt.list_checkpoints(out)] == [10]


def test_a_full_disk_without_mounting_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same diagnosis where no tmpfs can be mounted: torch.save dies half-way, the disk reads as full."""
    import dflash_base.disk as disk

    def torn_save(state: object, path: Path) -> None:
        Path(path).write_bytes(b"half a checkpoint")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 2048448 vs 2048340")

    monkeypatch.setattr(ckpt.torch, "save", torn_save)
    monkeypatch.setattr(ckpt, "require_space", lambda path, needed: None)
    monkeypatch.setattr(disk, "free_bytes", lambda path: 1000)
    with pytest.raises(NoSpace, match=r"step_00000020: it needs .*, 1\.0 kB free there"):
        ckpt.save_checkpoint(tmp_path, 20, state_of(4, 20), {}, keep=2)
    assert leftovers(tmp_path) == []


def test_an_error_that_is_not_the_disk_goes_through_unchanged(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="a bug"), writing(tmp_path / "x", needed=10):
        raise ValueError("a bug")


def test_an_export_that_cannot_fit_leaves_the_earlier_one(small_disk) -> None:  # noqa: F811
    disk = small_disk(512)
    model = tiny_drafter()
    first = export_drafter(model, disk / "export")
    fill(disk, leave=20 * 1024)
    with pytest.raises(NoSpace) as caught:
        export_drafter(model, disk / "export", dtype=torch.float32)
    assert caught.value.path == str(disk / "export" / "model.safetensors")
    assert leftovers(disk) == []
    reloaded = load_drafter(first, model.embed_weight, model.lm_head_weight)  # the earlier export, whole
    assert set(reloaded.state_dict()) == set(model.state_dict())


def test_an_export_whose_write_fails_midway_is_named(small_disk, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """safetensors' own error ("SafetensorError ... os error 28"), on a disk that filled after the check."""
    from trainer.model import export as export_module

    disk = small_disk(512)
    fill(disk, leave=60 * 1024)
    monkeypatch.setattr(export_module, "require_space", lambda path, needed: None)
    with pytest.raises(NoSpace, match=r"export/model\.safetensors: it needs"):
        export_drafter(tiny_drafter(), disk / "export", dtype=torch.float32)
    assert leftovers(disk) == [] and not (disk / "export").exists()


def step(number: int) -> StepMetrics:
    return StepMetrics(number, 1.0, 1e-3, 0.5, [0.0, 0.5], 1.5, 1.5, 100.0, 50.0, 10.0, 0.1, 0.0)


def test_a_metrics_line_cut_by_a_full_disk_is_taken_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, resume_step=0)
    log.write(step(1))
    real_write = os.write

    def half_then_full(fd: int, data: bytes) -> int:
        if len(data) > 40:
            return real_write(fd, bytes(data[:40]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(metrics_module.os, "write", half_then_full)
    with pytest.raises(NoSpace, match=r"metrics\.jsonl"):
        log.write(step(2))
    log.close()
    assert [r["step"] for r in read_metrics(path)] == [1]  # no torn line: a resume reads every line


def test_a_failed_runs_summary_on_a_full_disk_is_a_line_not_a_second_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def full(path: object, data: object) -> None:
        raise OSError(errno.ENOSPC, "cannot write it (No space left on device)", str(path))

    monkeypatch.setattr(metrics_module, "write_json_atomic", full)
    assert write_summary(tmp_path, {"status": "failed", "error": "NoSpace: ..."}) is None
    assert "summary.json not written: no space left" in capsys.readouterr().err
    with pytest.raises(NoSpace, match=r"summary\.json"):
        write_summary(tmp_path, {"status": "ok"})
