"""`serve-check --python` that is not a python is bad input (exit 2, "not a python"), not a bug report (issue 29)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dflash_doctor.cli import run


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_serve_check_with_a_python_that_is_not_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: exit 1, "a bug in dflash-doctor or in the engine; please report it"."""
    from tests.serving.test_serve_check import fake_export

    not_python = shutil.which("ls") or "/bin/ls"
    args = ["serve-check", "--export", str(fake_export(tmp_path / "e")), "--engine", "vllm"]
    assert run([*args, "--python", not_python]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"--python {not_python}: not a python" in err and "report" not in err
