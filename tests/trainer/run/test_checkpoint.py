"""Checkpoints: atomic folders, keep the last K, torn writes never listed; the LR schedule; metrics files."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from trainer.run import checkpoint as ckpt
from trainer.run.metrics import MetricsLog, StepMetrics, summarize
from trainer.run.optim import lr_factor
from trainer.runspec.outputs import read_metrics


def _save(out: Path, step: int, keep: int = 2) -> Path:
    return ckpt.save_checkpoint(out, step, {"w": torch.full((3,), float(step))}, {"next_batch": step}, keep)


def test_keep_last_k_and_latest(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        _save(tmp_path, step)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [20, 30]
    step, folder = ckpt.latest_checkpoint(tmp_path)
    assert step == 30 and folder.name == "step_00000030"
    assert torch.equal(ckpt.load_checkpoint(folder)["w"], torch.full((3,), 30.0))
    assert json.loads((folder / "meta.json").read_text()) == {"step": 30, "next_batch": 30}


def test_a_torn_write_is_never_taken_for_a_checkpoint(tmp_path: Path) -> None:
    _save(tmp_path, 10)
    root = ckpt.checkpoints_root(tmp_path)
    torn = root / ".tmp-step_00000020-999"  # killed mid-write: never renamed
    torn.mkdir()
    (torn / "state.pt").write_bytes(b"half")
    half = root / "step_00000030"  # a folder without its meta.json is not complete either
    half.mkdir()
    assert ckpt.latest_checkpoint(tmp_path)[0] == 10
    _save(tmp_path, 40)
    assert not torn.exists()  # the next save clears leftovers


def test_saving_the_same_step_again_replaces_it(tmp_path: Path) -> None:
    _save(tmp_path, 10)
    ckpt.save_checkpoint(tmp_path, 10, {"w": torch.zeros(1)}, {}, keep=2)
    assert torch.equal(ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path)[1])["w"], torch.zeros(1))


def test_the_checkpointer_needs_only_its_section_and_the_values_it_uses(tmp_path: Path) -> None:
    """Built from `[checkpoint]`, the output folder, optim.grad_accum and the config record (no TrainConfig):
    due every `every` steps and after the last; saves there, keeps `keep`; restores the weights."""
    import torch.distributed as dist

    from trainer.runspec.config import CheckpointSection
    from trainer.runspec.topology import Topology

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        state = ckpt.TrainState(model, optimizer, scheduler, torch.Generator().manual_seed(0))
        checkpointer = ckpt.Checkpointer(
            CheckpointSection(every=2, keep=1),
            tmp_path / "out",
            grad_accum=3,
            config={"run": {"seed": 7}},
            topology=Topology(1, 1),
            group=dist.group.WORLD,
            index=0,
            total_steps=5,
        )
        assert [s for s in range(1, 6) if checkpointer.due(s)] == [2, 4, 5]
        saved_weight = model.weight.detach().clone()
        checkpointer.save(state, 2)
        checkpointer.save(state, 4)
        assert [s for s, _ in ckpt.list_checkpoints(tmp_path / "out")] == [4]  # keep = 1
        saved = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path / "out")[1])
        assert saved["config"] == {"run": {"seed": 7}} and saved["next_batch"] == 4 * 3 * 1
        with torch.no_grad():
            model.weight.zero_()
        checkpointer.restore(state, 4, torch.device("cpu"))
        assert torch.equal(model.weight, saved_weight)
    finally:
        dist.destroy_process_group()


def test_warmup_then_cosine_to_the_floor() -> None:
    total = 100
    factors = [lr_factor(s, total, warmup_ratio=0.1, min_lr_ratio=0.2) for s in range(total)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)  # 10 warmup steps
    assert all(a < b for a, b in itertools.pairwise(factors[:10]))  # rising through warmup
    assert all(a >= b for a, b in itertools.pairwise(factors[9:]))  # then never rising again
    assert lr_factor(total, total, 0.1, 0.2) == pytest.approx(0.2)
    mid = lr_factor(10 + 45, total, 0.1, 0.2)
    assert mid == pytest.approx(0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi * 0.5)))


def _m(step: int, loss: float) -> StepMetrics:
    return StepMetrics(
        step=step, loss=loss, lr=1e-3, grad_norm=1.0, accuracy=[0.0, 0.5], accept_len=1.5,
        accept_len_from_accuracy=1.5, tok_s=100.0 * step, supervised_tok_s=50.0 * step, samples_s=1.0,
        step_time_s=0.1, data_wait_s=0.0,
    )  # fmt: skip


def test_metrics_on_resume_drop_steps_past_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, resume_step=0)
    for step in range(1, 8):
        log.write(_m(step, 10.0 - step))
    log.close()
    log = MetricsLog(path, resume_step=5)  # killed after step 7, last checkpoint at 5
    log.write(_m(6, 0.5))
    log.close()
    records = read_metrics(path)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert records[-1]["loss"] == 0.5
    summary = summarize(records, "ok", 3.0)
    assert summary["steps"] == 6 and summary["final_loss"] == 0.5 and summary["first_loss"] == 9.0
