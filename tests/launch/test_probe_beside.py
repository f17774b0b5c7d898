"""The gate's deep probe runs beside the static checks and the launch's warm-up beside the probe (issue 40 §2);
neither is ever left behind, and a failing probe still refuses."""

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
from tests.launch.test_probe_reuse import PASSING
from tests.launch.test_train_gate import launches  # noqa: F401  (fixture)

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


def _signalling_warm_up(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """prepare_compile_cache replaced by one that sets the returned event when the warm-up starts."""
    from dflash_doctor.launch import lifecycle
    from dflash_doctor.launch.compile_cache import CachePreparation

    warming = threading.Event()

    def prepare(*args: object, **kwargs: object) -> CachePreparation:
        warming.set()
        return CachePreparation("warm", "test", 0.0)

    monkeypatch.setattr(lifecycle, "prepare_compile_cache", prepare)
    return warming


def _cancellable_warm_up(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list[bool]]:
    """prepare_compile_cache replaced by a long compile: (set when it starts, whether a refusal stopped it)."""
    from dflash_doctor.launch import lifecycle
    from dflash_doctor.launch.compile_cache import CachePreparation

    warming = threading.Event()
    cancelled: list[bool] = []

    def prepare(*args: object, cancel: threading.Event | None = None, **kwargs: object) -> CachePreparation:
        warming.set()
        assert cancel is not None
        cancelled.append(cancel.wait(timeout=15))  # a long compile, stopped by the refusal
        return CachePreparation("warm", "test", 0.0)

    monkeypatch.setattr(lifecycle, "prepare_compile_cache", prepare)
    return warming, cancelled


def test_the_warm_up_runs_while_the_probe_runs(
    launches: list[list[str]],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    warming = _signalling_warm_up(monkeypatch)
    saw: list[bool] = []

    def probe(*args: object, **kwargs: object) -> ProbeReport:
        saw.append(warming.wait(timeout=15))  # the warm-up started before the probe ended
        return ProbeReport(raw=dict(PASSING), seconds=0.2)

    monkeypatch.setattr(deep_run, "run_probe", probe)
    assert run(["train", "--config", "tiny-cpu", "--deep"]) == 0
    assert saw == [True] and len(launches) == 1


def test_a_failing_probe_still_refuses_and_stops_the_warm_up_beside_it(
    launches: list[list[str]],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    warming, cancelled = _cancellable_warm_up(monkeypatch)

    def probe(*args: object, **kwargs: object) -> ProbeReport:
        warming.wait(timeout=15)
        return ProbeReport(error="the probe crashed (killed by signal 11) before printing its report")

    monkeypatch.setattr(deep_run, "run_probe", probe)
    assert run(["train", "--config", "tiny-cpu", "--deep"]) == 1 and launches == []
    assert cancelled == [True]
    assert "launch refused" in capsys.readouterr().out


def test_a_dry_run_warms_nothing(
    launches: list[list[str]],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dflash_doctor.launch import lifecycle

    def prepare(*args: object, **kwargs: object) -> None:
        raise AssertionError("a dry run warmed the compile cache")

    monkeypatch.setattr(lifecycle, "prepare_compile_cache", prepare)
    monkeypatch.setattr(deep_run, "run_probe", lambda *a, **k: ProbeReport(raw=dict(PASSING), seconds=0.2))
    assert run(["train", "--config", "tiny-cpu", "--deep", "--dry-run"]) == 0


def _replace_check(monkeypatch: pytest.MonkeyPatch, check_id: str, fn: object) -> None:
    registry.all_checks()  # the check modules register themselves on first use
    monkeypatch.setitem(registry._CHECKS, check_id, dataclasses.replace(registry._CHECKS[check_id], fn=fn))


SLOW_STATIC = "ownership.clobbered"  # hashes installed files: 10.5 s of a fresh H200's gate, with its kin


def test_the_warm_up_starts_while_the_slow_static_checks_still_run(
    launches: list[list[str]],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Was: the warm-up waited for every static check, though it depends only on gate.WARM_UP_NEEDS."""
    warming = _signalling_warm_up(monkeypatch)
    registry.all_checks()
    original = registry._CHECKS[SLOW_STATIC]
    saw: list[bool] = []

    def slow_static(ctx):  # type: ignore[no-untyped-def]
        saw.append(warming.wait(timeout=10))  # the warm-up began while this check still ran
        yield from original.fn(ctx)

    _replace_check(monkeypatch, SLOW_STATIC, slow_static)
    monkeypatch.setattr(deep_run, "run_probe", lambda *a, **k: ProbeReport(raw=dict(PASSING), seconds=0.2))
    assert run(["train", "--config", "tiny-cpu", "--deep"]) == 0
    assert saw == [True] and len(launches) == 1


def test_a_static_check_failing_after_the_warm_up_began_refuses_and_stops_it(
    launches: list[list[str]],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dflash_doctor.findings import Finding, Severity

    warming, cancelled = _cancellable_warm_up(monkeypatch)

    def failing_static(ctx):  # type: ignore[no-untyped-def]
        warming.wait(timeout=10)
        yield Finding(
            "ownership.clobbered", Severity.FAIL, "torch's files no longer match its RECORD", {}, "reinstall"
        )

    _replace_check(monkeypatch, SLOW_STATIC, failing_static)
    monkeypatch.setattr(deep_run, "run_probe", lambda *a, **k: ProbeReport(raw=dict(PASSING), seconds=0.2))
    assert run(["train", "--config", "tiny-cpu", "--deep"]) == 1 and launches == []
    assert cancelled == [True]
    assert "launch refused" in capsys.readouterr().out


def test_a_failing_check_the_warm_up_depends_on_starts_no_warm_up(
    launches: list[list[str]],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dflash_doctor.findings import Finding, Severity
    from dflash_doctor.launch import lifecycle

    def unsafe_cache(ctx):  # type: ignore[no-untyped-def]
        yield Finding("cache.permissions", Severity.FAIL, "the cache is writable by others", {}, "chmod 700")

    def prepare(*args: object, **kwargs: object) -> None:
        raise AssertionError("the warm-up wrote to a compile cache the gate refused")

    _replace_check(monkeypatch, "cache.permissions", unsafe_cache)
    monkeypatch.setattr(lifecycle, "prepare_compile_cache", prepare)
    monkeypatch.setattr(deep_run, "run_probe", lambda *a, **k: ProbeReport(raw=dict(PASSING), seconds=0.2))
    assert run(["train", "--config", "tiny-cpu", "--deep"]) == 1 and launches == []


def test_checks_named_first_run_first_and_are_reported_in_registry_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dflash_doctor.context import CheckContext

    ran: list[str] = []
    registry.all_checks()
    for check_id in ("cache.location", "hazards.compile", "startup.bytecode", "torch.build", "gpu.arch"):
        _replace_check(monkeypatch, check_id, lambda ctx, name=check_id: ran.append(name) or iter(()))
    walk = dataclasses.replace(
        registry._CHECKS["cache.location"], starts=lambda ctx: ran.append("walk started")
    )
    monkeypatch.setitem(registry._CHECKS, "cache.location", walk)
    seen_first: list[list[str]] = []
    monkeypatch.setattr(registry, "available", lambda ctx: {"deep", "lock", "config"})
    runs = registry.run_checks(
        CheckContext(None),  # type: ignore[arg-type]  # the replaced checks read nothing of it
        only=["cache.location", "hazards", "startup", "torch", "gpu.arch"],
        defer=["gpu.arch"],
        first=["startup", "hazards"],
        after_first=lambda first: seen_first.append([r.check.id for r in first]),
    )
    # what the first checks need comes first; a check that waits for work it started (the cache folders' walk)
    # after the other static checks, the work begun before any of them
    assert ran == [
        "walk started",
        "hazards.compile",
        "startup.bytecode",
        "torch.build",
        "cache.location",
        "gpu.arch",
    ]
    assert seen_first == [["hazards.compile", "startup.bytecode"]]
    assert [r.check.id for r in runs] == [
        "cache.location",
        "gpu.arch",
        "hazards.compile",
        "startup.bytecode",
        "torch.build",
    ]
