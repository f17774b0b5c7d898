"""`cache warm`: the child's command line and result parsing; the real compile is a slow test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_doctor.cache.warm import (
    CHILD_SCRIPT,
    WarmShapes,
    child_command,
    compile_count,
    parse_child_output,
)
from dflash_doctor.cache.warm_child import RESULT_PREFIX
from dflash_doctor.cli import run


def test_child_command_carries_shapes_and_config(tmp_path: Path) -> None:
    shapes = WarmShapes(heads=32, head_dim=128, kv_heads=8, anchors=1024, block=32, context=40000)
    command = child_command("/venv/bin/python", "cuda", shapes, tmp_path / "run.toml")
    assert command[:2] == ["/venv/bin/python", str(CHILD_SCRIPT)]
    assert (
        command[command.index("--anchors") + 1] == "1024"
        and command[command.index("--head-dim") + 1] == "128"
    )
    assert "--config" in command and "--project-root" in command


def test_child_result_is_parsed_and_counted() -> None:
    result = {"counters": {"inductor": {"fxgraph_cache_miss": 2, "fxgraph_cache_hit": 1}}}
    out = "warning: noise\n" + RESULT_PREFIX + json.dumps(result) + "\n"
    parsed = parse_child_output(out)
    assert parsed is not None and compile_count(parsed) == (2, 1)
    assert parse_child_output("no result here") is None


@pytest.mark.slow
def test_warm_compiles_flex_and_snapshots(
    cache_env: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["cache", "warm", "--json", "--name", "warmed"]) == 0
    data = json.loads(capsys.readouterr().out)
    misses, hits = data["fxgraph_misses"], data["fxgraph_hits"]
    assert misses + hits > 0 and data["snapshot"]["name"] == "warmed"
    assert (cache_env["snapshots"] / "warmed.tar.zst").is_file()


def test_the_warm_up_child_runs_where_the_launch_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config's relative paths (smollm2-135m: target.path = "runs/smollm2-135m/target") mean "from where
    `train` was run", for the workers and so for the warm-up child that builds the same drafter; run from "/",
    the child could not find the target and the launch failed before training."""
    import sys

    from dflash_doctor.cache.warm import run_warm_child

    monkeypatch.chdir(tmp_path)
    script = f"import json, os; print({RESULT_PREFIX!r} + json.dumps({{'cwd': os.getcwd()}}))"
    assert run_warm_child([sys.executable, "-c", script], dict(__import__("os").environ)) == {
        "cwd": str(tmp_path)
    }
