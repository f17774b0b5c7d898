"""Output that is not a terminal (a CI log, a pipe) is never cut at rich's 80-column fallback: an
error's hint, a finding's path and a remedy come out whole, each on one line (dflash_doctor/console.py).
The CLI runs in a child process here, its stdout and stderr real pipes, `COLUMNS` unset unless given."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_doctor.console import OFF_TERMINAL_WIDTH, make_console, off_terminal_width


def cli(args: list[str], **environ: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE")
    }
    return subprocess.run(
        [sys.executable, "-m", "dflash_doctor", *args],
        env={**env, **environ},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def long_folder(tmp_path: Path, leaf: str) -> Path:
    """A path of about 180 characters: more than two 80-column lines."""
    return tmp_path / ("long-folder-name-" * 4) / ("deeper-folder-" * 4) / leaf


def test_an_error_hint_naming_a_long_path_is_one_line_in_a_pipe(tmp_path: Path) -> None:
    home = long_folder(tmp_path, "home")
    home.parent.mkdir(parents=True)
    home.write_text("a file where the home folder belongs")
    done = cli(["cache", "list"], DFLASH_DOCTOR_HOME=str(home))
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert (
        f"error: {home} is a file, not a folder: the snapshot store {home}/cache/snapshots cannot be there"
        in lines
    )
    assert f"  hint: move {home} away, or set DFLASH_DOCTOR_HOME to another folder" in lines


def test_a_findings_path_and_remedy_are_whole_in_a_pipe(tmp_path: Path) -> None:
    """`check` to a pipe: the verdict column is as wide as its text, so no path is folded."""
    cache, home = long_folder(tmp_path, "inductor"), long_folder(tmp_path, "home")
    done = cli(["check", "--only", "cache"], TORCHINDUCTOR_CACHE_DIR=str(cache), DFLASH_DOCTOR_HOME=str(home))
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert any(f"inductor cache {cache} is in the shared temp folder" in line for line in lines), done.stdout
    assert f"path: {cache}" in lines
    assert "fix: export DFLASH_DOCTOR_HOME=<a folder of yours outside the temp folders>" in lines
    assert any(
        line.startswith(f"# the managed cache {home}/cache/inductor is volatile too") for line in lines
    )


def test_columns_is_honoured_and_a_remedy_is_still_whole(tmp_path: Path) -> None:
    cache, home = long_folder(tmp_path, "inductor"), long_folder(tmp_path, "home")
    done = cli(
        ["check", "--only", "cache"],
        TORCHINDUCTOR_CACHE_DIR=str(cache),
        DFLASH_DOCTOR_HOME=str(home),
        COLUMNS="70",
    )
    lines = done.stdout.splitlines()
    remedy = next(i for i, line in enumerate(lines) if "fix: export DFLASH_DOCTOR_HOME=" in line)
    assert lines[remedy + 1].strip().startswith(f"# the managed cache {home}/cache/inductor is volatile too")
    table = [line for i, line in enumerate(lines) if i not in (0, remedy, remedy + 1, len(lines) - 1)]
    assert table and max(len(line.rstrip()) for line in table) <= 70  # the table folds at COLUMNS


def test_width_off_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    assert off_terminal_width({"COLUMNS": "132"}) == 132
    assert (
        off_terminal_width({"COLUMNS": "0"}) == off_terminal_width({"COLUMNS": "wide"}) == OFF_TERMINAL_WIDTH
    )
    assert off_terminal_width({}) == OFF_TERMINAL_WIDTH
    monkeypatch.delenv("COLUMNS", raising=False)
    assert make_console(file=io.StringIO()).width == OFF_TERMINAL_WIDTH
    monkeypatch.setenv("COLUMNS", "90")
    assert make_console(file=io.StringIO()).width == 90
    terminal = make_console(file=io.StringIO(), force_terminal=True)
    assert terminal.is_terminal and terminal.width != OFF_TERMINAL_WIDTH  # rich asks the terminal


@pytest.mark.parametrize(
    "args",
    [["check"], ["--help"], ["cache", "warm", "--help"], ["train", "--config", "tiny-cpu", "--dry-run"]],
)
def test_no_line_ends_in_blanks_in_a_pipe(args: list[str], tmp_path: Path) -> None:
    """rich pads a table's rows to the table's width: `check` came out 206-330 columns wide, a 68-character
    line padded to 179, `--help` to 80. In a pipe no line ends in a blank, stdout or stderr."""
    extra = ["--no-deep"] if args[0] == "train" else []
    done = cli([*args, *extra], DFLASH_DOCTOR_HOME=str(tmp_path / "home"))
    assert done.stdout.strip()
    for stream in (done.stdout, done.stderr):
        padded = [line for line in stream.splitlines() if line != line.rstrip(" \t")]
        assert padded == [], padded[:3]


def test_blanks_ending_a_line_are_dropped_also_across_writes() -> None:
    from dflash_doctor.console import NoTrailingBlanks

    sink = io.StringIO()
    stream = NoTrailingBlanks(sink)
    for piece in ("a table row   ", "  ", "\nnext  \t\n  indented stays", "  ", "\n"):
        stream.write(piece)
    assert sink.getvalue() == "a table row\nnext\n  indented stays\n"
