"""End to end on CPU: `torchrun -m trainer` with 1 target + 1 drafter, and with 2 targets + 1 drafter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.trainer_runs import REPO, environment, reference_run, torchrun


def test_one_target_one_drafter_loss_falls() -> None:
    run = reference_run()
    assert run.returncode == 0, run.stderr[-3000:]
    metrics = run.metrics
    assert [m["step"] for m in metrics] == list(range(1, 41))
    first, last = metrics[0], metrics[-1]
    assert last["loss"] < first["loss"] - 1.0
    assert len(last["accuracy"]) == 8 and last["accuracy"][0] == 0.0  # slot 0 is the anchor: never scored
    assert all(m["tok_s"] > 0 and m["samples_s"] > 0 and m["data_wait_s"] >= 0 for m in metrics)
    assert metrics[9]["lr"] > metrics[-1]["lr"]  # cosine decay after warmup
    summary = run.summary
    assert summary["status"] == "ok" and summary["steps"] == 40 and summary["final_loss"] == last["loss"]
    assert summary["warmup"]["attention"] == "sdpa"
    startup = summary["warmup"]["startup"]  # where the drafter rank's time to its first batch went
    assert {"start + imports", "process group", "build", "compile", "total"} <= startup.keys()
    assert startup["total"] == pytest.approx(sum(v for k, v in startup.items() if k != "total"), abs=0.05)
    for role in ("target", "drafter"):
        assert f"({role}) ready in " in run.stderr
    assert "step 40/40" in run.stdout


def test_the_run_leaves_checkpoints_and_a_loadable_export() -> None:
    run = reference_run()
    assert run.returncode == 0, run.stderr[-3000:]
    checkpoints = sorted(p.name for p in (run.out_dir / "checkpoints").iterdir())
    assert checkpoints == ["step_00000020", "step_00000040"]
    config = json.loads((run.out_dir / "export" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["dflash_config"]["mask_token_id"] == 511 and config["dtype"] == "bfloat16"
    assert "serve with vllm: vllm serve tiny --speculative-config" in run.stdout
    assert run.summary["export_dir"] == str(run.out_dir / "export")
    # the export holds the trained weights: the same as the final checkpoint's
    import torch

    from trainer.model.export import load_drafter
    from trainer.run.checkpoint import load_checkpoint
    from trainer.target_model.load import load_frozen_embeddings

    embed, lm_head, _ = load_frozen_embeddings("tiny", seed=0)
    exported = load_drafter(run.out_dir / "export", embed, lm_head).state_dict()
    trained = load_checkpoint(run.out_dir / "checkpoints" / "step_00000040")["model"]
    assert set(exported) == set(trained)
    for name, tensor in trained.items():  # exported in bf16 (output.export_dtype's default)
        assert torch.equal(exported[name], tensor.to(torch.bfloat16).float()), name


def test_the_disk_plan_covers_what_the_run_wrote_and_not_much_more() -> None:
    """launch.disk's estimates against this real run's files: each checkpoint and the export fit their
    estimate, with no more than the fixed allowance for records to spare."""
    from dflash_doctor.launch.disk_plan import CHECKPOINT_OVERHEAD_BYTES, EXPORT_OVERHEAD_BYTES, DiskFacts
    from dflash_doctor.launch.plan import NodeFacts, build_launch_plan
    from tests.trainer.trainer_runs import SHORT
    from trainer.runspec.config import load_config
    from trainer.runspec.target_shapes import target_hf_config

    run = reference_run()
    assert run.returncode == 0, run.stderr[-3000:]
    cfg = load_config("tiny-cpu", [f"{k}={v}" for k, v in SHORT.items()])
    plan = build_launch_plan(
        cfg, REPO, target_hf_config("tiny"), sys.executable, NodeFacts(0, disk=DiskFacts())
    )
    writes = {w.what: w for w in plan.disk}
    for folder in (run.out_dir / "checkpoints").iterdir():
        real = sum(f.stat().st_size for f in folder.iterdir())
        assert real <= writes["checkpoints"].each <= real + 2 * CHECKPOINT_OVERHEAD_BYTES, folder
    assert writes["checkpoints"].bytes == 2 * writes["checkpoints"].each  # 40 steps, one every 20: 2 saves
    exported = sum(f.stat().st_size for f in (run.out_dir / "export").iterdir())
    assert exported <= writes["export"].bytes <= exported + EXPORT_OVERHEAD_BYTES
    metrics = (run.out_dir / "metrics.jsonl").stat().st_size
    assert metrics <= writes["metrics"].bytes


def test_two_targets_one_drafter(tmp_path: Path) -> None:
    """2+1 consumes the very same batches in the same order as 1+1: identical losses, step for step."""
    run = torchrun("configs/tiny-cpu-2t1d.toml", tmp_path / "out", nproc=3)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.summary["topology"].items() >= {"mode": "split", "targets": 2, "drafters": 1}.items()
    pairs = [(p["target_rank"], p["drafter_rank"]) for p in run.summary["topology"]["pairs"]]
    assert pairs == [(0, 2), (1, 2)]  # both targets feed the one drafter
    reference = reference_run()
    assert reference.returncode == 0
    assert [m["loss"] for m in run.metrics] == [m["loss"] for m in reference.metrics]


def test_warm_up_needs_no_process_group() -> None:
    """What `dflash-doctor cache warm` calls: one forward+backward at the config's shapes, main thread."""
    import torch.distributed as dist

    from trainer.run.warmup import warm_up
    from trainer.runspec.config import load_config

    report = warm_up(load_config("tiny-cpu", ["optim.anchors=8", "data.seq_len=32", "optim.batch_size=2"]))
    assert (
        report["attention"] == "sdpa" and report["device"] == "cpu" and report["compiled"] == ["LM head + CE"]
    )
    assert report["shapes"] == {"batch_size": 2, "seq_len": 32, "anchors": 8, "block_size": 8}
    assert report["seconds"] > 0
    assert not dist.is_initialized()


def test_grad_accumulation_and_heldout_evaluation(tmp_path: Path) -> None:
    """2 micro-steps per step, 13 of 64 sequences held out, scored after steps 5 and 10 (all 13: the last
    batch holds one, issue 38 D8): the figures land in metrics.jsonl and summary.json, and tok/s counts real
    tokens only."""
    overrides = {
        "optim.steps": "10", "optim.grad_accum": "2", "data.eval_fraction": "0.2", "eval.every": "5",
        "checkpoint.every": "0",
    }  # fmt: skip
    run = torchrun("configs/tiny-cpu.toml", tmp_path / "out", nproc=2, overrides=overrides)
    assert run.returncode == 0, run.stderr[-3000:]
    metrics = run.metrics
    evaluated = [m["step"] for m in metrics if m["heldout_accept_len"] is not None]
    assert evaluated == [5, 10]
    assert all(1.0 <= m["heldout_accept_len"] <= 8.0 for m in metrics if m["step"] in evaluated)
    assert all(m["samples_s"] * m["step_time_s"] == pytest.approx(8) for m in metrics)  # 4 x 2 x 1 drafter
    assert all(m["supervised_tok_s"] < m["tok_s"] for m in metrics)  # prompts are context, not supervised
    summary = run.summary
    assert summary["heldout_accept_len"] == metrics[-1]["heldout_accept_len"]
    # tiny-cpu's data are single-answer records: the last answer is every answer
    assert summary["heldout_accept_len_last_answer"] == summary["heldout_accept_len"]
    assert [m["heldout_sequences"] for m in metrics if m["step"] in evaluated] == [13, 13]
    assert summary["heldout_sequences"] == 13 and summary["sequences_per_step"] == 8
    assert summary["heldout_evals"] == 2 and 0 < summary["heldout_share_of_time"] < 1
    assert "held-out accept" in run.stdout


@pytest.mark.slow  # ~13 s; the folder loading itself is covered fast in test_target.py
def test_a_local_target_folder_with_jsonl_data(tmp_path: Path) -> None:
    """A Hugging Face folder as the target (only the captured layers loaded; embedding and head read from
    its safetensors on the drafter rank) and pre-tokenised JSONL data."""
    import torch

    from trainer.data.sources import sample_sequences
    from trainer.target_model.tiny import build_embedded_target

    model = build_embedded_target("tiny", seed=0)
    model.save_pretrained(tmp_path / "target")
    # 48 sequences: tiny-cpu holds out an eighth for evaluation, at least one batch of 4
    seqs = sample_sequences(model, 48, 64, 4, 0.5, 511, torch.Generator().manual_seed(0))
    lines = [json.dumps({"input_ids": s.tolist(), "loss_mask": [0] * 4 + [1] * 60}) for s in seqs]
    (tmp_path / "data.jsonl").write_text("\n".join(lines) + "\n")
    overrides = {
        "target.path": json.dumps(str(tmp_path / "target")),
        "drafter.mask_token_id": "511",
        "data.kind": '"jsonl"',
        "data.path": json.dumps(str(tmp_path / "data.jsonl")),
        "optim.steps": "6",
        "checkpoint.every": "0",
    }
    run = torchrun("configs/tiny-cpu.toml", tmp_path / "out", nproc=2, overrides=overrides)
    assert run.returncode == 0, run.stderr[-3000:]
    assert [m["step"] for m in run.metrics] == list(range(1, 7))
    assert (tmp_path / "out" / "export" / "config.json").is_file()


@pytest.mark.slow
def test_the_default_tiny_run_learns(tmp_path: Path) -> None:
    """The shipped tiny-cpu config as a user runs it (`python -m trainer`, which starts torchrun itself):
    per-position accuracy far above chance (1/512) and the loss well down. About 2 minutes on 2 cores."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--config", "tiny-cpu", "--set", f"output.dir={json.dumps(str(out))}"],
        cwd=REPO, env=environment(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = metrics[-20:]
    slot1 = sum(m["accuracy"][1] for m in last) / len(last)
    assert slot1 > 0.25  # chance is 0.002
    assert sum(m["loss"] for m in last) / len(last) < metrics[0]["loss"] - 3.0
    assert sum(m["accept_len"] for m in last) / len(last) > 1.25
    summary = json.loads((out / "summary.json").read_text())
    assert summary["heldout_accept_len"] >= 1.5  # on sequences never trained on, against the target
