"""Metrics people can look at: TensorBoard event files, W&B (faked), run curves as PNG and sparklines."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from dflash_base.errors import ConfigError, DoctorError
from dflash_doctor.launch.run_curves import (
    Curves,
    plot_curves,
    plot_title,
    read_curves,
    sparkline,
    sparkline_rows,
)
from trainer.run.metric_sinks import TensorBoardSink, WandbSink, scalars_of
from trainer.runspec.extras import require_extra

ROW = {
    "step": 3,
    "loss": 2.5,
    "lr": 1e-3,
    "accuracy": [0.0, 0.5, 0.25],
    "accept_len": 1.6,
    "heldout": {"accept_len_target": 1.7, "n": 4},
    "tok_s": float("nan"),
    "note": "text",
    "flag": True,
}


def test_every_number_of_a_metrics_line_becomes_a_scalar() -> None:
    assert scalars_of(ROW) == {
        "loss": 2.5,
        "lr": 1e-3,
        "accuracy/0": 0.0,
        "accuracy/1": 0.5,
        "accuracy/2": 0.25,
        "accept_len": 1.6,
        "heldout/accept_len_target": 1.7,
        "heldout/n": 4.0,
    }  # step is the x axis; NaN, strings and booleans are left out


def test_tensorboard_event_files_are_readable_by_tensorboards_own_reader(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(tmp_path / "tb")
    for step in (1, 2, 3):
        sink.write(step, scalars_of(ROW | {"loss": 3.0 - step}))
    sink.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert {"loss", "accuracy/1", "heldout/accept_len_target"} <= set(events.Tags()["scalars"])
    loss = events.Scalars("loss")
    assert [(e.step, e.value) for e in loss] == [(1, 2.0), (2, 1.0), (3, 0.0)]


def test_a_missing_extra_is_a_config_error_naming_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"output\.wandb: needs the `wandb` package") as info:
        require_extra("wandb", "output.wandb")
    assert "dflash-doctor[wandb]" in (info.value.hint or "")
    require_extra("tensorboard", "output.tensorboard")  # installed: quiet


def test_wandb_sink_logs_each_step_once_after_a_resume(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    logged: list[tuple[dict, int]] = []
    run = types.SimpleNamespace(
        log=lambda d, step: logged.append((d, step)), finish=lambda: logged.append(({}, -1))
    )
    fake = types.SimpleNamespace(init=lambda **kw: run)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    sink = WandbSink("proj", tmp_path / "wandb", "run-a", {"seed": 0}, resume_step=2)
    for step in (1, 2, 3):
        sink.write(step, {"loss": float(step)})
    sink.close()
    assert logged == [({"loss": 3.0}, 3), ({}, -1)]


def write_metrics(path: Path, losses: list[float]) -> Path:
    lines = [
        json.dumps({"step": i + 1, "loss": v, "accept_len": 1 + i / 10, "tok_s": 100.0})
        for i, v in enumerate(losses)
    ]
    path.write_text("\n".join(lines) + "\n{torn")
    return path


def test_curves_skip_a_torn_line_and_draw_sparklines(tmp_path: Path) -> None:
    curves = read_curves(write_metrics(tmp_path / "m.jsonl", [4.0, 3.0, 2.0, 1.0]), "run-a")
    assert curves.series["loss"] == [(1, 4.0), (2, 3.0), (3, 2.0), (4, 1.0)]
    assert sparkline([4.0, 3.0, 2.0, 1.0]) == "█▆▃▁"  # lowest ▁, highest █
    assert len(sparkline(list(map(float, range(1000))), width=40)) == 40
    names = [name for name, _, _ in sparkline_rows(curves)]
    assert names == ["loss", "accept_len", "tok_s"]


def test_plot_writes_a_png_overlaying_two_runs(tmp_path: Path) -> None:
    a = read_curves(write_metrics(tmp_path / "a.jsonl", [4.0, 3.0, 2.0]), "a")
    b = read_curves(write_metrics(tmp_path / "b.jsonl", [5.0, 2.0, 1.0]), "b")
    out = plot_curves([a, b], tmp_path / "plots" / "runs.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not list(out.parent.glob(".*partial"))
    with pytest.raises(DoctorError, match=r"must end in \.png"):
        plot_curves([a], tmp_path / "runs.txt")
    with pytest.raises(DoctorError, match="no metrics yet"):
        plot_curves([Curves("empty", {})], tmp_path / "e.png")


def test_a_plot_of_many_runs_counts_them_in_its_title_instead_of_running_off_the_figure() -> None:
    runs = [Curves(f"{n}k", {}, config="smollm2-135m.toml") for n in (7.5, 15, 30, 60)]
    assert plot_title(runs) == "4 runs (config smollm2-135m.toml)"
    assert plot_title([*runs[:2], Curves("x", {}, config="tiny-cpu.toml")]) == "3 runs"
    assert (
        plot_title(runs[:2]) == "run 7.5k (config smollm2-135m.toml) and run 15k (config smollm2-135m.toml)"
    )


def test_runs_show_and_compare_draw_the_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dflash_doctor.cli import run
    from dflash_doctor.launch.runs import RunStore

    store = RunStore()
    records = []
    for name, losses in (("a", [4.0, 3.0, 2.0]), ("b", [5.0, 2.5, 1.5])):
        out = tmp_path / name
        out.mkdir()
        write_metrics(out / "metrics.jsonl", losses)
        records.append(store.create("succeeded", output_dir=str(out), metrics={"final_loss": losses[-1]}))
    assert run(["runs", "show", records[0].id, "--plot", str(tmp_path / "a.png")]) == 0
    shown = capsys.readouterr().out
    assert "summary" in shown and "4 -> 2" in shown and "█" in shown  # the table, then the sparklines
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"
    assert run(["runs", "compare", records[0].id, records[1].id, "--plot", str(tmp_path / "ab.png")]) == 0
    compared = capsys.readouterr().out
    assert records[0].id in compared and records[1].id in compared and "final loss" in compared
    assert (tmp_path / "ab.png").stat().st_size > 1000
    refused = store.create("refused")
    assert run(["runs", "show", refused.id, "--plot", str(tmp_path / "r.png")]) == 2
    assert "no output folder" in " ".join(capsys.readouterr().err.split())


def test_a_tiny_cpu_run_writes_tensorboard_events_and_plots(tmp_path: Path) -> None:
    """A real run (tiny-cpu, shortened, 1 target + 1 drafter over gloo) with output.tensorboard = true."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.trainer.trainer_runs import torchrun

    run = torchrun(
        "configs/tiny-cpu.toml", tmp_path / "out", nproc=2, overrides={"output.tensorboard": "true"}
    )
    assert run.returncode == 0, run.stderr[-2000:]
    events = EventAccumulator(str(tmp_path / "out" / "tensorboard"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"loss", "tok_s", "accuracy/1", "lr", "grad_norm", "data_wait_s"} <= scalars
    assert [e.step for e in events.Scalars("loss")] == [r["step"] for r in run.metrics]
    assert [round(e.value, 4) for e in events.Scalars("loss")] == [round(r["loss"], 4) for r in run.metrics]
    png = plot_curves([read_curves(tmp_path / "out" / "metrics.jsonl", "tiny")], tmp_path / "tiny.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_asking_for_a_missing_extra_refuses_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from trainer.runspec.config import load_config

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"output\.tensorboard: needs the `tensorboard` package"):
        load_config("tiny-cpu", ["output.tensorboard=true"])
    load_config("tiny-cpu")  # not asked for: no check
