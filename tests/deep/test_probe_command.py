"""`probe` on an interpreter whose `import torch` fails: exit 1 and a report that says so, with a progress
line on stderr (issue 18)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from dflash_doctor.cli import run


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DFLASH_DOCTOR_DEBUG", raising=False)
    return tmp_path / "home"


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
