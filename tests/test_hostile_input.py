"""Issue 18 outside `train`: damaged state and hostile input end in a named error (exit 2) or recovery;
anything unexpected is a one-line bug report (exit 3) with the traceback only on request."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from dflash_base.errors import InterpreterError
from dflash_doctor.cli import run
from dflash_doctor.commands import runs as runs_command
from dflash_doctor.env.interpreter import InterpreterProbe
from dflash_doctor.launch.runs import RunStore
from dflash_doctor.lock.lockfile import LOCK_SCHEMA, build_lock
from tests.conftest import env_for
from tests.fakeenv import FakeSite


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DFLASH_DOCTOR_DEBUG", raising=False)
    return tmp_path / "home"


# ---------------------------------------------------------------- the error boundary


def test_an_unexpected_exception_is_a_one_line_bug_report(monkeypatch, capsys) -> None:
    def broken(*args: object, **kwargs: object) -> list[object]:
        raise TypeError("unhashable type: 'list'")

    monkeypatch.setattr(runs_command.RunStore, "all", broken)
    assert run(["runs"]) == 3
    err = capsys.readouterr().err
    assert "internal error: TypeError: unhashable type: 'list'" in err and "please report" in err
    assert "Traceback" not in err
    monkeypatch.setenv("DFLASH_DOCTOR_DEBUG", "1")
    assert run(["runs"]) == 3
    assert "Traceback" in capsys.readouterr().err


def test_an_os_error_names_the_file_exit_2(monkeypatch, capsys, tmp_path) -> None:
    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(tmp_path / "home" / "state" / "runs"))

    monkeypatch.setattr(runs_command.RunStore, "all", denied)
    assert run(["runs"]) == 2
    err = capsys.readouterr().err
    assert "Permission denied" in err and str(tmp_path / "home") in err and "Traceback" not in err


# ---------------------------------------------------------------- locks: one code, a named field


def good_lock(tmp_path: Path) -> dict:
    site = FakeSite(tmp_path / "site")
    site.add_torch()
    return build_lock(env_for(site), {}, None, {}).to_json()


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"garbage", "not a dflash-doctor lock"),
        (bytes(range(256)), "not UTF-8"),
        (b"[1, 2, 3]", "not a JSON object"),
    ],
)
def test_a_lock_that_is_not_a_lock_is_exit_2_for_check_and_diff(tmp_path, capsys, content, words) -> None:
    lock = tmp_path / "bad.lock"
    lock.write_bytes(content)
    for command in (["check", "--lock", str(lock), "--only", "torch"], ["diff", str(lock), str(lock)]):
        assert run(command) == 2, command
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err
    assert run(["check", "--lock", str(tmp_path / "missing.lock")]) == 2


@pytest.mark.parametrize(
    ("field", "value"),
    [("distributions", ["torch"]), ("gpus", {"0": "H200"}), ("environment", {"CUDA_HOME": 12})],
)
def test_a_lock_with_a_wrong_typed_field_names_it(tmp_path, capsys, field, value) -> None:
    data = good_lock(tmp_path)
    data[field] = value
    lock = tmp_path / "typed.lock"
    lock.write_text(json.dumps(data))
    assert run(["diff", str(lock), str(lock)]) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err
    assert run(["check", "--lock", str(lock), "--only", "torch"]) == 2
    assert field in capsys.readouterr().err


def test_a_lock_of_a_future_schema_says_made_by_a_newer_version(tmp_path, capsys) -> None:
    data = good_lock(tmp_path)
    data["schema"] = LOCK_SCHEMA.replace("/v1", "/v2")
    lock = tmp_path / "future.lock"
    lock.write_text(json.dumps(data))
    assert run(["diff", str(lock), str(lock)]) == 2
    err = capsys.readouterr().err
    assert "made by a newer version" in err and "not a dflash-doctor lock" not in err


def test_lock_out_where_nothing_can_be_written_is_a_named_error(capsys, monkeypatch, tmp_path) -> None:
    assert run(["lock", "--out", "/proc/version"]) == 2
    err = capsys.readouterr().err
    assert "lock --out /proc/version" in err and "Traceback" not in err

    def read_only(src: object, dst: object) -> None:  # a read-only folder, as seen by a non-root user
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", read_only)
    assert run(["lock", "--out", str(tmp_path / "ro" / "dflash.lock")]) == 2
    err = capsys.readouterr().err
    assert "Permission denied" in err and str(tmp_path / "ro" / "dflash.lock") in err
    assert not list((tmp_path / "ro").iterdir())  # nothing half-written


# ---------------------------------------------------------------- run records


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b'{"schema": "dflash-doctor/run/v1", "id": "x", "crea', "not JSON"),
        (b"", "empty"),
        (b"\x00\xff garbage", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (
            b'{"schema": "dflash-doctor/run/v1", "id": "x", "created": "yesterday", "status": "failed"}',
            "created",
        ),
        (
            b'{"schema": "dflash-doctor/run/v1", "id": "x", "created": 1, "status": "failed", "notes": [1]}',
            "notes",
        ),
    ],
)
def test_a_damaged_record_is_skipped_by_runs_and_named_by_runs_show(capsys, content, words) -> None:
    store = RunStore()
    kept = store.create("succeeded", metrics={"steady_tok_s": 1000.0, "final_loss": 2.5})
    damaged = store.root / "20991231-235959-dead" / "record.json"
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(content)
    assert run(["runs"]) == 0
    captured = capsys.readouterr()
    assert kept.id in captured.out and "damaged run record" in captured.err and words in captured.err
    assert run(["runs", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in listed["runs"]] == [kept.id] and len(listed["damaged"]) == 1
    assert run(["runs", "show", "20991231"]) == 2
    err = capsys.readouterr().err
    assert "is damaged" in err and str(damaged) in err and "Traceback" not in err
    assert run(["runs", "show", kept.id]) == 0
    out = capsys.readouterr().out
    rows = {" ".join(line.replace("│", " ").split()) for line in out.splitlines()}
    assert "final loss 2.5" in rows and "tok/s 1,000" in rows and "{" not in out  # a table, not a dict repr


def test_runs_in_a_pipe_prints_whole_ids_and_paths(capsys) -> None:
    long_path = "/a/rather/long/folder/name/for/configs/of/this/team/qwen3-8b-b16-with-a-long-name.toml"
    record = RunStore().create("failed", config_path=long_path, exit_code=1)
    assert run(["runs"]) == 0  # captured: not a terminal
    line = next(line for line in capsys.readouterr().out.splitlines() if record.id in line)
    assert line.split("\t")[0] == record.id and long_path in line.split("\t")


def test_runs_limit_0_is_a_usage_error() -> None:
    assert run(["runs", "--limit", "0"]) == 2


# ---------------------------------------------------------------- --python wrapper scripts, probe


def test_a_wrapper_script_that_never_answers_times_out_and_leaves_nothing(tmp_path: Path) -> None:
    wrapper = tmp_path / "wrapper.sh"
    marker = f"1000.{os.getpid()}"  # `sleep 1000.<pid>`: found again by its arguments
    wrapper.write_text(f"#!/bin/sh\nsleep {marker}\n")  # no `exec`: the sleep holds the pipes
    wrapper.chmod(0o755)
    began = time.monotonic()
    with pytest.raises(InterpreterError, match="no answer within 1 s"):
        InterpreterProbe(str(wrapper), timeout=1.0).result()
    assert time.monotonic() - began < 15
    time.sleep(0.2)
    left = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
    assert left == []


@pytest.mark.skipif(shutil.which("python3") is None, reason="needs a python3 on PATH")
def test_probe_exits_1_when_import_torch_fails(tmp_path: Path, capsys) -> None:
    venv = tmp_path / "venv"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    assert run(["probe", "--json", "--no-flex", "--python", python]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["schema"] == "dflash-doctor/probe-report/v1"
    assert report["raw"]["import"]["ok"] is False
    assert "probing" in captured.err  # a line while it works, on stderr


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


def test_a_folder_where_a_file_belongs_is_named_before_any_work(tmp_path: Path, capsys) -> None:
    assert run(["check", "--lock", str(tmp_path)]) == 2
    assert "a folder, not a lock file" in capsys.readouterr().err
    began = time.monotonic()
    assert run(["probe", "--out", str(tmp_path)]) == 2  # before the probe's minute of work, not after
    assert "a folder, not a file" in capsys.readouterr().err and time.monotonic() - began < 10
