"""A `--python` wrapper script that never answers times out and leaves no process behind (issue 18)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from dflash_base.errors import InterpreterError
from dflash_doctor.env.interpreter import InterpreterProbe


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DFLASH_DOCTOR_DEBUG", raising=False)
    return tmp_path / "home"


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
