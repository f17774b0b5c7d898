"""`lock` writes: its --json carries a schema, and an --out where nothing can be written is a named error with
nothing half-written (issue 18)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dflash_doctor.cli import run


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DFLASH_DOCTOR_DEBUG", raising=False)
    return tmp_path / "home"


def test_lock_json_carries_a_schema(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    assert run(["lock", "--json", "--out", str(tmp_path / "dflash.lock")]) == 0
    assert json.loads(capsys.readouterr().out)["schema"] == "dflash-doctor/lock-written/v1"


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
