"""The start-up clock: phases add up, each mark is the time since the previous one, the report names them."""

from __future__ import annotations

import builtins
import time
from typing import Any

import pytest

from trainer.run import startup
from trainer.run.startup import StartupClock


def test_phases_are_the_time_between_marks_and_add_up_to_the_total(
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock = StartupClock()
    assert clock.phases["start + imports"] > 0  # this process started before the test
    time.sleep(0.05)
    first = clock.mark("build")
    second = clock.mark("compile")
    assert first >= 0.05 and second < first
    assert clock.as_dict()["total"] == pytest.approx(round(clock.total_s, 2))
    clock.mark("build")  # a phase marked twice adds up
    assert clock.phases["build"] >= first
    line = clock.report(3, "drafter")
    assert line.startswith("dflash trainer: rank 3 (drafter) ready in ")
    assert "start + imports" in line and "build" in line and "compile" in line
    assert line in capsys.readouterr().err


def test_without_psutil_the_process_age_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_psutil(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "psutil":
            raise ImportError("no psutil here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_psutil)
    assert startup._process_age_s() is None
    clock = StartupClock()
    assert "start + imports" not in clock.phases
    clock.mark("build")
    assert list(clock.phases) == ["build"]
