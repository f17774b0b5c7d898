"""Issue 18's "smaller ones": remedies paste as printed, help says no `<bool>`, JSON carries a schema,
a CPU rank has no CUDA context, the flex skip names its real reason, the progress explains itself."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from dflash_doctor.cli import run
from dflash_doctor.context import CheckContext, CheckOptions
from dflash_doctor.deep import run as deep_run
from dflash_doctor.deep.run import ProbeReport
from dflash_doctor.findings import fail
from dflash_doctor.launch.plan import plan_inputs
from dflash_doctor.registry import Check, CheckRun
from dflash_doctor.report import remedy_lines, render
from tests.conftest import env_for
from trainer.run.metrics import LEGEND, Progress, StepMetrics
from trainer.spec.config import load_config
from trainer.spec.target_shapes import target_shapes

LONG = "export TORCHINDUCTOR_CACHE_DIR=/home/someone/.cache/dflash-doctor/cache/inductor-for-this-team"


def rendered(remedy: str, width: int) -> str:
    finding = fail(
        "cache.volatile", "the compile cache is in a temp folder " * 3, remedy=remedy, path="/tmp/x"
    )
    runs = [CheckRun(Check("cache.volatile", "compile cache", lambda c: []), [finding], 0.0)]
    out = io.StringIO()
    render(runs, Console(file=out, width=width, highlight=False))
    return out.getvalue()


@pytest.mark.parametrize("width", [80, 40])
def test_a_remedy_is_printed_whole_at_any_width(width: int) -> None:
    text = rendered(LONG + "  # a cache only you own", width)
    fix_line = next(line for line in text.splitlines() if "fix:" in line)
    assert fix_line.strip() == f"fix: {LONG}"  # whole, and nothing after it on the same line
    assert "# a cache only you own" in text.split(fix_line)[1].splitlines()[1]


def test_a_multi_line_remedy_is_a_fenced_block() -> None:
    assert remedy_lines("pip uninstall -y a\npip install b") == [
        ("fix:", "bold cyan"),
        ("```", "dim"),
        ("pip uninstall -y a", "cyan"),
        ("pip install b", "cyan"),
        ("```", "dim"),
    ]


def test_flags_show_no_bool_metavar_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["runs", "--help"], ["check", "--help"], ["train", "--help"]):
        assert run(command) == 0
        json_line = next(line for line in capsys.readouterr().out.splitlines() if "--json" in line)
        assert "<bool>" not in json_line, command


@pytest.mark.parametrize(
    "command",
    [[], ["check"], ["cache", "restore"], ["cache", "prune"], ["cache", "warm"], ["cache", "status"],
     ["data", "regenerate"], ["data", "preview"], ["train"], ["eval"], ["serve-check"], ["runs", "show"]],
)  # fmt: skip
def test_one_help_style_no_flag_shows_a_type(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """`--help`, `--force`, `--dry-run`, `--no-snapshot`, `--json` alike: a flag shows no `<bool>`; an option
    that takes a value still shows its type."""
    assert run([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "<bool>" not in out, [line for line in out.splitlines() if "<bool>" in line]
    assert "--help" in out
    if command == ["cache", "warm"]:
        assert "<int>" in next(line for line in out.splitlines() if "--heads" in line)


def test_lock_json_carries_a_schema(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    assert run(["lock", "--json", "--out", str(tmp_path / "dflash.lock")]) == 0
    assert json.loads(capsys.readouterr().out)["schema"] == "dflash-doctor/lock-written/v1"


def test_a_cpu_rank_is_planned_without_a_cuda_context() -> None:
    cfg = load_config("tiny-cpu")
    shapes = target_shapes(cfg.target.path)
    cpu, gpu = plan_inputs(cfg, shapes, "cpu"), plan_inputs(cfg, shapes, "cuda")
    assert cpu.overhead_part == "process_overhead" and gpu.overhead_part == "cuda_context"


def test_the_gates_flex_skip_names_its_reason_not_a_flag_nobody_gave(site, monkeypatch) -> None:
    skipped = ProbeReport(raw={"flex": {"status": "skipped", "reason": "skipped (--no-flex)"}})
    monkeypatch.setattr(deep_run, "run_probe", lambda *a, **k: skipped)
    ctx = CheckContext(env_for(site), CheckOptions(deep=True, extra={"deep_flex": False}))
    assert "--no-flex" not in deep_run.deep_report(ctx).flex["reason"]
    assert "SDPA" in deep_run.deep_report(ctx).flex["reason"]


def step(n: int) -> StepMetrics:
    return StepMetrics(
        step=n, loss=2.0, lr=1e-3, grad_norm=1.0, accuracy=[0.5], accept_len=1.58,
        accept_len_from_accuracy=1.5, tok_s=100.0, supervised_tok_s=50.0, samples_s=1.0, step_time_s=0.1, data_wait_s=0.0,
    )  # fmt: skip


def test_progress_explains_accept_and_prints_nothing_before_the_first_step() -> None:
    out = io.StringIO()
    progress = Progress(total_steps=10, start_step=0, log_every=5, stream=out)
    assert out.getvalue() == ""  # other ranks' "ready" lines are not drawn over before training starts
    progress.update(step(1))
    lines = out.getvalue().splitlines()
    assert lines[0] == LEGEND and "acceptance length" in LEGEND
    assert "accept 1.58" in lines[1]
