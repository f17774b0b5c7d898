"""Damaged run state: a damaged record is skipped by `runs` (with a warning) and named by `runs show`; a home
that is a file is a named error, never "No runs yet" (issues 18 and 29)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_doctor.cli import run
from dflash_doctor.launch.runs import RunStore


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DFLASH_DOCTOR_DEBUG", raising=False)
    return tmp_path / "home"


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


def test_runs_with_a_home_that_is_a_file_says_so(tmp_path: Path, monkeypatch, capsys) -> None:
    """Was: "No runs yet", exit 0."""
    home = tmp_path / "homefile"
    home.write_text("x")
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(home))
    assert run(["runs"]) == 2
    assert f"{home} is a file, not a folder" in " ".join(capsys.readouterr().err.split())
    assert run(["runs", "show", "x"]) == 2
