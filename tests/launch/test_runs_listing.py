"""How `runs` lists past launches: whole ids and paths in a pipe, lines rather than a cut table on a terminal,
and `--limit 0` a usage error (issue 18)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_doctor.cli import run
from dflash_doctor.launch.runs import RunStore


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DFLASH_DOCTOR_DEBUG", raising=False)
    return tmp_path / "home"


def test_runs_in_a_pipe_prints_whole_ids_and_paths(capsys) -> None:
    long_path = "/a/rather/long/folder/name/for/configs/of/this/team/qwen3-8b-b16-with-a-long-name.toml"
    record = RunStore().create("failed", config_path=long_path, exit_code=1)
    assert run(["runs"]) == 0  # captured: not a terminal
    line = next(line for line in capsys.readouterr().out.splitlines() if record.id in line)
    assert line.split("\t")[0] == record.id and long_path in line.split("\t")


def test_runs_limit_0_is_a_usage_error() -> None:
    assert run(["runs", "--limit", "0"]) == 2


def test_runs_on_a_wide_terminal_falls_back_to_lines_rather_than_cut_a_path(monkeypatch, capsys) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich: a terminal
    monkeypatch.setenv("COLUMNS", "160")
    short = RunStore().create("failed", config_path="/c/short.toml", exit_code=1)
    assert run(["runs"]) == 0
    assert "┃" in capsys.readouterr().out  # a table: everything fits
    long_path = "/very/" + "long/" * 40 + "config.toml"
    RunStore().create("failed", config_path=long_path, exit_code=1)
    assert run(["runs"]) == 0
    out = capsys.readouterr().out
    assert long_path in out and short.id in out and "┃" not in out
