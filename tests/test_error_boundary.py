"""The CLI's one error boundary: an unexpected exception is a one-line bug report (exit 3, the traceback only
on request), an OSError names its file (exit 2) (issue 18)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_doctor.cli import run
from dflash_doctor.commands import runs as runs_command


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DFLASH_DOCTOR_DEBUG", raising=False)
    return tmp_path / "home"


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
