"""Colocated topology on CPU: every rank captures its own batches and trains on them (no transport).

The data-order contract: colocated on K ranks trains on the batches a split with K drafters trains on,
so the losses match step for step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.trainer_runs import reference_run, torchrun

COLOCATED = {"topology.mode": '"colocated"'}


def test_one_colocated_process_trains_like_one_target_and_one_drafter(tmp_path: Path) -> None:
    run = torchrun("configs/tiny-cpu.toml", tmp_path / "out", nproc=1, overrides=COLOCATED)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.summary["topology"].items() >= {"mode": "colocated", "targets": 1, "drafters": 1}.items()
    assert "(colocated) ready in " in run.stderr
    startup = run.summary["warmup"]["startup"]
    assert {"build target", "data", "build", "compile"} <= startup.keys()
    reference = reference_run()
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert [m["step"] for m in run.metrics] == list(range(1, 41))
    assert [m["loss"] for m in run.metrics] == pytest.approx([m["loss"] for m in reference.metrics], rel=1e-5)
    assert (run.out_dir / "export" / "config.json").is_file()
    assert sorted(p.name for p in (run.out_dir / "checkpoints").iterdir()) == [
        "step_00000020",
        "step_00000040",
    ]


def test_two_colocated_ranks_train_on_the_batches_of_two_drafters(tmp_path: Path) -> None:
    """Colocated on 2 ranks (DDP over both) against 1 target + 2 drafters: same batches, same losses."""
    short = {"optim.steps": "6", "checkpoint.every": "3"}
    colocated = torchrun("configs/tiny-cpu.toml", tmp_path / "c", nproc=2, overrides={**short, **COLOCATED})
    assert colocated.returncode == 0, colocated.stderr[-3000:]
    assert colocated.summary["topology"].items() >= {"mode": "colocated", "targets": 2, "drafters": 2}.items()
    split = torchrun(
        "configs/tiny-cpu.toml", tmp_path / "s", nproc=3, overrides={**short, "topology.drafters": "2"}
    )
    assert split.returncode == 0, split.stderr[-3000:]
    losses = [m["loss"] for m in colocated.metrics]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert losses == pytest.approx([m["loss"] for m in split.metrics], rel=1e-5)
    # 2 ranks x batch 4 per step, as the split's 2 drafters
    assert colocated.metrics[0]["samples_s"] * colocated.metrics[0]["step_time_s"] == pytest.approx(8)


def test_colocated_refuses_a_process_count_other_than_its_ranks(tmp_path: Path) -> None:
    over = {**COLOCATED, "topology.ranks": "2"}
    run = torchrun("configs/tiny-cpu.toml", tmp_path / "out", nproc=1, overrides=over, timeout=120)
    assert run.returncode != 0
    assert "topology.ranks: 2 colocated ranks, but torchrun started 1 process " in run.stderr
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


@pytest.mark.gpu
def test_colocated_on_one_gpu_with_compiled_target_and_drafter_layers(tmp_path: Path) -> None:
    """CUDA: the capture runs compiled under no_grad and the drafter (compiled flex) trains on its output."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    over = {**COLOCATED, "run.device": '"cuda"', "optim.steps": "6", "checkpoint.every": "3"}
    run = torchrun("configs/tiny-cpu.toml", tmp_path / "out", nproc=1, overrides=over)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = run.summary
    assert summary["status"] == "ok" and summary["topology"]["mode"] == "colocated"
    assert summary["warmup"]["attention"] == "flex" and "compile target" in summary["warmup"]["startup"]
    losses = [m["loss"] for m in run.metrics]
    assert len(losses) == 6 and all(loss == loss for loss in losses)  # no NaN


@pytest.mark.gpu
def test_an_overlapped_capture_trains_on_the_same_batches(tmp_path: Path) -> None:
    """topology.overlap_capture: the next capture on a second CUDA stream (from when it is queued, or from
    the optimizer update's start) changes when it runs, not what it computes: the losses equal the
    single-stream run's, step for step."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    over = {**COLOCATED, "run.device": '"cuda"', "optim.steps": "8", "checkpoint.every": "0"}
    runs = {
        flag: torchrun(
            "configs/tiny-cpu.toml",
            tmp_path / f"out-{flag}",
            nproc=1,
            overrides={**over, "topology.overlap_capture": f'"{flag}"'},
        )
        for flag in ("off", "step", "optimizer")
    }
    for run in runs.values():
        assert run.returncode == 0, run.stderr[-3000:]
    losses = {flag: [m["loss"] for m in run.metrics] for flag, run in runs.items()}
    assert len(losses["off"]) == 8
    for mode in ("step", "optimizer"):
        assert losses[mode] == pytest.approx(losses["off"], rel=1e-6, abs=1e-6), mode


@pytest.mark.gpu
def test_warm_up_covers_the_colocated_target_on_its_device() -> None:
    """The launcher's warm-up child (trainer.run.warmup.warm_up) compiles both roles' layers on one device."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from trainer.run.warmup import warm_up
    from trainer.runspec.config import load_config

    over = ['topology.mode="colocated"', 'run.device="cuda"', "data.seq_len=64", "optim.anchors=8"]
    report = warm_up(load_config("tiny-cpu", over), "cuda:0")
    assert report["target"]["device"] == "cuda:0" and report["attention"] == "flex"
    split = warm_up(load_config("tiny-cpu", over[1:]), "cuda:0")
    assert "target" not in split  # a split's target ranks compile their own
