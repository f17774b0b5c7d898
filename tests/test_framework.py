"""The check framework: registry, runner, report, exit codes, CLI errors."""

from __future__ import annotations

import json

import pytest

from dflash_doctor import registry
from dflash_doctor.cli import run
from dflash_doctor.context import CheckContext
from dflash_doctor.findings import Finding, Severity, fail, ok, warn, worst
from dflash_doctor.report import REPORT_SCHEMA, exit_code, summary_line, to_json
from tests.conftest import env_for


def test_exit_code_rules() -> None:
    assert exit_code([ok("a.b", "fine")]) == 0
    assert exit_code([ok("a.b", "fine"), warn("a.c", "meh")]) == 0
    assert exit_code([warn("a.c", "meh")], strict=True) == 1
    assert exit_code([fail("a.d", "bad")]) == 1
    assert worst([ok("a", "x"), fail("a", "y"), warn("a", "z")]) is Severity.FAIL


def test_matches_selects_area_and_exact_id() -> None:
    assert registry.matches("libs.resolution", ["libs"])
    assert registry.matches("libs.resolution", ["libs.resolution"])
    assert not registry.matches("libs.resolution", ["lib"])
    assert not registry.matches("torch.build", ["libs"])
    assert registry.matches("torch.build", [])


def test_crashing_check_becomes_a_failing_finding(site, monkeypatch) -> None:
    def boom(ctx: CheckContext) -> list[Finding]:
        raise RuntimeError("kaput")

    monkeypatch.setitem(registry._CHECKS, "zz.boom", registry.Check("zz.boom", "boom", boom))
    runs = registry.run_checks(CheckContext(env_for(site)), ["zz"])
    assert [f.id for r in runs for f in r.findings] == ["zz.boom.crashed"]
    assert runs[0].findings[0].severity is Severity.FAIL
    assert "kaput" in runs[0].findings[0].summary


def test_checks_with_unmet_requirements_do_not_run(site, monkeypatch) -> None:
    monkeypatch.setitem(
        registry._CHECKS,
        "zz.deep",
        registry.Check("zz.deep", "deep", lambda c: [ok("zz.deep", "ran")], frozenset({"deep"})),
    )
    ctx = CheckContext(env_for(site))
    assert registry.run_checks(ctx, ["zz"]) == []
    ctx.options.deep = True
    assert len(registry.run_checks(ctx, ["zz"])) == 1


class Work:
    """Started work that records whether it was collected or cancelled."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        log.append("started")

    def cancel(self) -> None:
        self.log.append("cancelled")


def test_started_work_begins_first_and_its_checks_run_last(site, monkeypatch) -> None:
    """A check's starter runs before any check; the checks that wait for it run after those that start
    nothing; the report keeps registry order; work nobody took is cancelled at the end."""
    log: list[str] = []

    def start_walk(ctx: CheckContext) -> None:
        ctx.start("zz.walk", lambda: Work(log))

    def waiting(ctx: CheckContext) -> list[Finding]:
        log.append("a.waiting ran" + (" with its work" if ctx.started("zz.walk") else ""))
        return [ok("zz.a", "waited")]

    def plain(ctx: CheckContext) -> list[Finding]:
        log.append("b.plain ran")
        return [ok("zz.b", "plain")]

    for check in (
        registry.Check("zz.a", "waits", waiting, starts=start_walk),
        registry.Check("zz.b", "plain", plain),
        registry.Check("zz.c", "waits too", lambda ctx: [ok("zz.c", "same starter")], starts=start_walk),
    ):
        monkeypatch.setitem(registry._CHECKS, check.id, check)
    ctx = CheckContext(env_for(site))
    runs = registry.run_checks(ctx, ["zz"])
    assert [r.check.id for r in runs] == ["zz.a", "zz.b", "zz.c"]  # registry order in the report
    assert log == ["started", "b.plain ran", "a.waiting ran with its work"]  # started once, taken once
    assert list(ctx.start_seconds) == ["zz.walk"] and ctx.start_seconds["zz.walk"] >= 0  # what it cost here
    log.clear()
    ctx = CheckContext(env_for(site))
    assert [r.check.id for r in registry.run_checks(ctx, ["zz.b"])] == ["zz.b"]
    assert log == ["b.plain ran"] and ctx.start_seconds == {}  # a check not chosen starts nothing
    log.clear()
    registry.run_checks(CheckContext(env_for(site)), ["zz.c"])
    assert log == ["started", "cancelled"]  # zz.c never takes the work: its children are ended


def test_a_starter_that_fails_leaves_the_work_to_its_check(site, monkeypatch) -> None:
    def broken(ctx: CheckContext) -> None:
        raise OSError("no fork today")

    def waiting(ctx: CheckContext) -> list[Finding]:
        return [ok("zz.a", "did the work itself" if ctx.started("zz.walk") is None else "had it")]

    monkeypatch.setitem(registry._CHECKS, "zz.a", registry.Check("zz.a", "waits", waiting, starts=broken))
    runs = registry.run_checks(CheckContext(env_for(site)), ["zz"])
    assert [f.summary for r in runs for f in r.findings] == ["did the work itself"]


def test_json_report_is_versioned_and_complete(site) -> None:
    site.add_torch()
    runs = registry.run_checks(CheckContext(env_for(site)), ["torch"])
    data = to_json(runs, {"python": "x"})
    assert data["schema"] == REPORT_SCHEMA
    assert data["exit_code"] == 0
    assert {f["id"] for f in data["findings"]} >= {"torch.build"}
    assert all(set(f) == {"id", "severity", "summary", "evidence", "remedy"} for f in data["findings"])
    assert "No issues" in summary_line(runs).plain


def test_summary_line_names_bad_areas() -> None:
    run_ = registry.CheckRun(
        registry.Check("libs.x", "x", lambda c: []),
        [fail("libs.missing", "gone"), warn("libs.shadow", "hmm")],
        0.0,
    )
    line = summary_line([run_]).plain
    assert "1 area (libs)" in line and "1 failing" in line and "1 warning" in line


def test_cli_bad_python_is_exit_2(capsys, tmp_path) -> None:
    assert run(["check", "--python", str(tmp_path / "nope")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_cli_unknown_only_is_exit_2(capsys) -> None:
    assert run(["check", "--only", "no-such-area"]) == 2
    assert "no check matches" in capsys.readouterr().err


def test_cli_unknown_option_is_exit_2() -> None:
    assert run(["check", "--no-such-flag"]) == 2


def test_cli_json_on_this_interpreter(capsys) -> None:
    code = run(["check", "--json", "--only", "torch"])
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == REPORT_SCHEMA
    assert code == data["exit_code"]


@pytest.mark.parametrize("flag", ["--version"])
def test_version_flag(flag: str, capsys) -> None:
    assert run([flag]) == 0
    assert "dflash-doctor" in capsys.readouterr().out


@pytest.mark.parametrize("strict", [False, True])
def test_console_check_exits_quickly_with_its_whole_output_and_exit_code(strict: bool, tmp_path) -> None:
    """`check` ends the process right after flushing (no interpreter teardown): nothing may be lost."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, DFLASH_DOCTOR_HOME=str(tmp_path / "home"))
    args = [sys.executable, "-m", "dflash_doctor", "check", "--json", "--no-lock", "--only", "torch,hazards"]
    done = subprocess.run([*args, *(["--strict"] if strict else [])], capture_output=True, text=True, env=env)
    report = json.loads(done.stdout)
    assert done.returncode == report["exit_code"] and done.stdout.endswith("}\n")
    bad = subprocess.run(
        [*args, "--python", str(tmp_path / "absent")], capture_output=True, text=True, env=env, check=False
    )
    assert bad.returncode == 2 and "no such file" in " ".join(bad.stderr.split())  # rich wraps lines
