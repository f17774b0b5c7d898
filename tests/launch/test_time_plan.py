"""The plan's time estimate (dflash_doctor/launch/time_plan.py, issue 39 U2): steps x one step's seconds,
measured by an earlier run of the same config on this machine, else projected from the role rates (CUDA), else
a declared per-device figure, else said to be unknown; printed by `train --dry-run` beside memory and disk."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from dflash_base.errors import DoctorError
from dflash_doctor.cli import run
from dflash_doctor.launch.plan import LaunchPlan, NodeFacts, build_launch_plan
from dflash_doctor.launch.runs import RunRecord, RunStore
from dflash_doctor.launch.time_plan import DeclaredStep, config_shape, load_step_times, planned_steps
from tests.launch.test_train_gate import launches  # noqa: F401  (fixture)
from trainer.runspec.config import TrainConfig, load_config
from trainer.runspec.config_file import resolve_config_path
from trainer.runspec.target_shapes import target_shapes

TINY = resolve_config_path("tiny-cpu")


def tiny_plan(
    sets: list[str] | None = None,
    records: list[RunRecord] | None = None,
    text: str | None = None,
    gpus: int = 0,
    name: str = "tiny-cpu",
) -> tuple[TrainConfig, LaunchPlan]:
    path = resolve_config_path(name)
    cfg = load_config(path, sets or [])
    plan = build_launch_plan(
        cfg,
        path,
        target_shapes(cfg.target.path),
        "/fake/python",
        NodeFacts(gpus),
        overrides=sets,
        records=records if records is not None else [],
        config_text=text if text is not None else path.read_text(),
    )
    return cfg, plan


def past_run(
    plan: LaunchPlan, steady_seconds: float, steady_steps: int, text: str | None = None
) -> RunRecord:
    """A finished run of `plan` on this host whose summary measured `steady_steps` steps in `steady_seconds`."""
    return RunRecord(
        id="20261203-120000-abcd",
        created=1.0,
        status="succeeded",
        config_text=TINY.read_text() if text is None else text,
        command=plan.command,
        plan=plan.to_json(),
        metrics={"steady_seconds": steady_seconds, "steady_step_count": steady_steps},
        host=socket.gethostname(),
    )


def test_a_run_of_the_same_config_here_gives_its_measured_step_time() -> None:
    _, first = tiny_plan()
    _, plan = tiny_plan(records=[past_run(first, 30.0, 120)])
    assert plan.time is not None and plan.time.source == "measured"
    assert plan.time.step_s == pytest.approx(0.25) and plan.time.total_s == pytest.approx(300 * 0.25)
    assert plan.time.line().startswith(
        "time: 300 steps (optim.steps) x 0.250 s a step (measured: run 20261203-120000-abcd of this config on "
        "this machine, 120 steady steps) = about 1m15s of training steps"
    )
    assert plan.to_json()["time"]["source"] == "measured"


def test_a_run_that_differs_only_in_how_long_it_ran_still_measures_the_step() -> None:
    _, first = tiny_plan(["optim.steps=40", "eval.every=10"])
    _, plan = tiny_plan(["optim.steps=900"], records=[past_run(first, 10.0, 20)])
    assert plan.time is not None and plan.time.source == "measured" and plan.time.steps == 900


@pytest.mark.parametrize(
    "other",
    [
        {"sets": ["optim.batch_size=4"]},  # another step
        {"text": TINY.read_text() + "\n# edited\n"},  # another config text
        {"host": "another-machine"},
        {"metrics": {}},  # a run that never reached a steady window
    ],
)
def test_a_run_of_another_shape_or_machine_is_not_used(other: dict) -> None:
    _, first = tiny_plan(other.get("sets"))
    record = past_run(first, 30.0, 120, other.get("text"))
    record.host = other.get("host", record.host)
    record.metrics = other.get("metrics", record.metrics)
    _, plan = tiny_plan(records=[record])
    assert plan.time is not None and plan.time.source != "measured"


def test_without_a_measured_run_a_declared_figure_for_these_shapes_is_used() -> None:
    from dflash_doctor.launch.time_plan import estimate_time

    cfg, plan = tiny_plan()
    assert plan.memory_inputs is not None
    entry = DeclaredStep("tiny-cpu", "cpu", config_shape(cfg, plan.memory_inputs), 0.05, "a test's figure")
    estimate = estimate_time(cfg, plan.memory_inputs, "cpu", plan.choice, "", plan.command, [], [entry])
    assert estimate.source == "declared" and estimate.step_s == pytest.approx(8 * 0.05)
    assert (
        "tiny-cpu's 0.05 s a sequence per CPU rank x 8 sequences per rank a step; a test's figure"
        in estimate.line()
    )
    other = DeclaredStep("x", "cuda", entry.shape, 0.05, "a GPU's")  # another device: not this one's figure
    assert (
        estimate_time(cfg, plan.memory_inputs, "cpu", plan.choice, "", plan.command, [], [other]).source
        == "none"
    )


def test_with_no_figure_the_line_says_there_is_none() -> None:
    _, plan = tiny_plan()
    assert plan.time is not None and plan.time.step_s is None and plan.time.source == "none"
    assert plan.time.line().startswith(
        "time: 300 steps (optim.steps); no step time for this config on this device"
    )


def test_on_gpus_the_role_rates_project_the_step() -> None:
    cfg, plan = tiny_plan(gpus=1, name="qwen3-8b-b16")
    assert plan.time is not None and plan.time.source == "projected"
    sequences = cfg.optim.batch_size * cfg.optim.grad_accum
    assert plan.time.step_s == pytest.approx(sequences / 4.7161)  # role_rates.json's colocated b16 rate


def test_epochs_count_steps_as_the_trainer_does() -> None:
    from trainer.data.sources import split_data
    from trainer.run.schedule import plan_run

    cfg = load_config(TINY, ["optim.epochs=2.5"])
    steps, basis = planned_steps(cfg, drafters=1)
    training = len(split_data(cfg).train_ids)
    assert steps == plan_run(cfg, training, 1).total_steps == 142  # 461 // 8 = 57 batches an epoch, x 2.5
    assert basis == "optim.epochs 2.5 over 461 training sequences"


def test_a_damaged_step_times_table_is_a_named_error(tmp_path: Path) -> None:
    bad = tmp_path / "step_times.json"
    bad.write_text(json.dumps({"entries": [{"recipe": "x"}]}))
    with pytest.raises(DoctorError, match="is malformed"):
        load_step_times(bad)
    assert load_step_times(tmp_path / "absent.json") == []
    assert all(e.seconds_per_sequence > 0 and e.source for e in load_step_times())  # the shipped one reads


def test_dry_run_prints_the_estimate_beside_the_plans(launches, capsys) -> None:  # noqa: F811
    assert run(["train", "--config", "tiny-cpu", "--no-deep", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "disk at the peak:" in out and "time: 300 steps (optim.steps)" in out
    _, plan = tiny_plan()
    RunStore().save(past_run(plan, 12.0, 48))  # the same config measured here before
    assert run(["train", "--config", "tiny-cpu", "--no-deep", "--dry-run", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["plan"]["time"]["source"] == "measured" and document["plan"]["time"]["step_s"] == 0.25


def test_the_shipped_recipe_finds_its_declared_step_on_cpu_and_gpu(tmp_path: Path) -> None:
    """smollm2-135m's declared figures (step_times.json) match the shipped config at SmolLM2-135M's shapes, so a
    CPU user's dry-run of the recipe says days before the first step, not nothing."""
    from dflash_doctor.launch.plan import plan_inputs
    from dflash_doctor.launch.time_plan import estimate_time

    shapes = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "vocab_size": 49152, "max_position_embeddings": 8192, "tie_word_embeddings": True, "rms_norm_eps": 1e-5,
        "bos_token_id": 1, "eos_token_id": 2,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(shapes))
    cfg = load_config(
        "smollm2-135m",
        [f"target.path={json.dumps(str(tmp_path))}", "optim.steps=100", "drafter.mask_token_id=3"],
        check_data=False,
    )
    for device, per_sequence in (("cpu", 8.1), ("cuda", 0.00381)):
        inputs = plan_inputs(cfg, target_shapes(cfg.target.path), device)
        estimate = estimate_time(cfg, inputs, device, None, "", [], [])
        assert estimate.source == "declared", (device, estimate)
        assert estimate.step_s == pytest.approx(16 * 2 * per_sequence)  # the recipe's 16 x 2 a step
