"""A folder given where a file belongs (`check --lock`, `probe --out`) is named before any work (issue 18)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dflash_doctor.cli import run


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DFLASH_DOCTOR_DEBUG", raising=False)
    return tmp_path / "home"


def test_a_folder_where_a_file_belongs_is_named_before_any_work(tmp_path: Path, capsys) -> None:
    assert run(["check", "--lock", str(tmp_path)]) == 2
    assert "a folder, not a lock file" in capsys.readouterr().err
    began = time.monotonic()
    assert run(["probe", "--out", str(tmp_path)]) == 2  # before the probe's minute of work, not after
    assert "a folder, not a file" in capsys.readouterr().err and time.monotonic() - began < 10
