"""`data regenerate`'s progress (dflash_doctor/progress.py), issue 39 U2/U3: tokens counted while a chunk is
answered (was: `0/12459 0 tok/s` for minutes, until the first chunk ended), and a time estimate printed once,
after the first commit (remaining conversations x the pace so far)."""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from rich.console import Console

from dflash_doctor.progress import RegenerateProgress, regenerate_estimate
from trainer.engine.target import Chat
from trainer.regenerate.job import Summary
from trainer.regenerate.settings import Completion


def pipe_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=200), out


def test_lines_in_a_pipe_count_the_tokens_of_the_chunk_in_flight() -> None:
    console, _ = pipe_console()
    progress = RegenerateProgress(console, quiet=False)
    summary = Summary()
    progress.show(summary, 10)  # the work counted, nothing written yet
    summary.in_flight_tokens, summary.seconds = 120, 2.0
    progress.tokens(summary)
    assert progress.describe().startswith(
        "regenerating: 0 of 10 conversations written, 0 answers, 120 tokens (60 tok/s)"
    )


def test_the_first_commit_prints_the_estimate_once() -> None:
    console, out = pipe_console()
    progress = RegenerateProgress(console, quiet=False)
    summary = Summary()
    progress.show(summary, 1000)
    assert "estimate" not in out.getvalue()  # nothing is known before the first commit
    summary.written, summary.seconds = 8, 60.0
    progress.show(summary, 1000)
    summary.written, summary.seconds = 16, 120.0
    progress.show(summary, 1000)
    said = [line for line in out.getvalue().splitlines() if line.startswith("estimate:")]
    assert said == [
        "estimate: 992 conversations left x 7.5 s each (the pace of the 8 written so far on this device) = "
        "about 2h04m; --limit N answers fewer"
    ]


def test_the_estimate_is_quiet_with_nothing_to_estimate() -> None:
    assert regenerate_estimate(0, 10.0, 5) is None
    assert regenerate_estimate(5, 10.0, 5) is None  # nothing left
    assert regenerate_estimate(1, 30.0, 3) == (
        "estimate: 2 conversations left x 30.0 s each (the pace of the 1 written so far on this device) = "
        "about 1m00s; --limit N answers fewer"
    )


def test_in_a_pipe_the_command_says_tokens_before_the_first_chunk_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI wires the engine's counts to the lines: a heartbeat line while the one chunk is answered
    already counts its tokens (was: `0 tokens (0 tok/s)` until it was written)."""
    from bench.lib.target_folder import make_target_folder
    from dflash_doctor import progress
    from dflash_doctor.cli import run as cli_run
    from dflash_doctor.commands import data as data_command

    class SlowCountingEngine:
        name = "fake"
        rows_at_once = 1

        def __init__(self) -> None:
            self.on_tokens = None

        def generate(self, chats: Sequence[Chat]) -> list[Completion]:
            for _ in range(4):
                assert self.on_tokens is not None
                self.on_tokens(len(chats))
                time.sleep(0.3)
            return [Completion("an answer", 4, "stop") for _ in chats]

        def close(self) -> None:
            pass

    target = make_target_folder(tmp_path / "target")
    monkeypatch.setattr(progress, "EVERY_S", 0.2)
    monkeypatch.setattr(data_command, "_engine_factory", lambda *a: SlowCountingEngine)
    (tmp_path / "in.jsonl").write_text("".join(f'{{"id": "r{i}", "prompt": "w1"}}\n' for i in range(3)))
    config = tmp_path / "run.toml"
    config.write_text(
        f'[target]\npath = "{target}"\n[data]\nkind = "chat"\npath = "x.jsonl"\n[optim]\nsteps = 1\n'
    )
    argv = ["data", "regenerate", "--config", str(config), "--prompts", str(tmp_path / "in.jsonl")]
    assert cli_run([*argv, "--out", str(tmp_path / "out.jsonl")]) == 0
    err = capsys.readouterr().err.splitlines()
    waiting = [line for line in err if line.startswith("regenerating: 0 of 3 conversations written")]
    assert any(" 0 tokens" not in line and "tokens (" in line for line in waiting), err
