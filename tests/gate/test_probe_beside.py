"""The gate's deep probe runs beside the static checks (issue 40 §2), and is never left behind."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from dflash_doctor import registry
from dflash_doctor.cli import run
from dflash_doctor.deep import run as deep_run
from dflash_doctor.deep.run import ProbeReport
from dflash_doctor.launch.beside import Beside
from dflash_doctor.processes import ChildCancelled, run_child
from tests.gate.test_probe_reuse import PASSING
from tests.gate.test_train_gate import launches  # noqa: F401  (fixture)

LAST_STATIC = "torch.build"  # registered after every deep check: the old gate ran it after the probe


def test_the_probe_runs_while_the_static_checks_run(
    launches: list[list[str]],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    static_done = threading.Event()
    registry.all_checks()  # the check modules register themselves on first use
    original = registry._CHECKS[LAST_STATIC]

    def last_static(ctx):  # type: ignore[no-untyped-def]
        yield from original.fn(ctx)
        static_done.set()

    monkeypatch.setitem(registry._CHECKS, LAST_STATIC, dataclasses.replace(original, fn=last_static))
    saw: list[bool] = []

    def probe(*args: object, **kwargs: object) -> ProbeReport:
        saw.append(static_done.wait(timeout=15))  # still running when the last static check ends
        return ProbeReport(raw=dict(PASSING), seconds=0.2)

    monkeypatch.setattr(deep_run, "run_probe", probe)
    assert run(["train", "--config", "tiny-cpu", "--deep"]) == 0
    assert saw == [True] and len(launches) == 1


def test_stopping_a_probe_beside_stops_its_child(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"

    def probe(cancel: threading.Event) -> object:
        return run_child([sys.executable, "-c", script], 120, "the probe", cancel=cancel)

    beside = Beside(probe, "test-probe").start()
    deadline = time.monotonic() + 30
    while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    began = time.monotonic()
    beside.stop()
    assert time.monotonic() - began < 15  # not the child's 60 s
    assert not psutil.pid_exists(pid)
    with pytest.raises(ChildCancelled):
        beside.result()
