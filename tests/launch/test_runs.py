"""Run records: atomic, listed, and `runs show` diffs a bad run's environment against the last good one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_doctor.cli import run
from dflash_doctor.launch.runs import RunStore
from dflash_doctor.lock.lockfile import build_lock
from tests.conftest import env_for
from tests.fakeenv import FakeSite


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def lock_of(site: FakeSite) -> dict:
    return build_lock(env_for(site), {}, None, {}).to_json()


def test_show_names_the_torch_build_that_changed_since_the_last_good_run(tmp_path: Path, capsys) -> None:
    good_site, bad_site = FakeSite(tmp_path / "a"), FakeSite(tmp_path / "b")
    good_site.add_torch(version="2.10.0+cu128", cuda="12.8", git="a" * 40)
    bad_site.add_torch(version="2.10.0+cu128", cuda="12.8", git="b" * 40)  # "the same" version
    store = RunStore()
    good = store.create("succeeded", environment=lock_of(good_site), metrics={"steady_tok_s": 20000.0})
    bad = store.create("failed", environment=lock_of(bad_site), metrics={"steady_tok_s": 5400.0}, exit_code=1)
    assert run(["runs", "show", bad.id, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["baseline"] == good.id
    commits = [c for c in shown["changes"] if "commit" in c["kind"] or "git" in c["kind"]]
    assert commits and commits[0]["before"].startswith("a") and commits[0]["after"].startswith("b")
    assert commits[0]["severity"] == "fail"
    assert run(["runs", "show", bad.id]) == 0
    assert "last successful run" in capsys.readouterr().out


def test_list_and_unknown_id(capsys) -> None:
    assert run(["runs"]) == 0
    assert "No runs yet" in capsys.readouterr().out
    RunStore().create("refused", config_path="x.toml")
    assert run(["runs", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["schema"] == "dflash-doctor/runs/v1" and listed["runs"][0]["status"] == "refused"
    assert run(["runs", "show", "nope"]) == 2


def test_torn_record_is_skipped_not_fatal(home: Path) -> None:
    store = RunStore()
    kept = store.create("succeeded")
    (store.root / "torn").mkdir(parents=True)
    (store.root / "torn" / "record.json").write_text('{"schema": "dflash-doc')
    assert [r.id for r in store.all()] == [kept.id]
    assert not list(store.root.rglob("*.tmp"))


def test_last_successful_ignores_later_and_failed_runs() -> None:
    store = RunStore()
    first = store.create("succeeded")
    failed = store.create("failed")
    later = store.create("succeeded")
    assert store.last_successful(before=failed).id == first.id
    assert store.last_successful().id == later.id


def test_a_failed_run_keeps_its_last_stderr_lines_and_runs_show_prints_them(capsys) -> None:
    import sys

    from dflash_doctor.launch.supervise import run_torchrun

    failing = (
        "import sys; print('error: data.path: d.jsonl line 100: not JSON', file=sys.stderr); sys.exit(1)"
    )
    outcome = run_torchrun([sys.executable, "-c", failing], {})
    assert outcome.exit_code == 1 and not outcome.interrupted
    assert outcome.stderr_tail == ("error: data.path: d.jsonl line 100: not JSON",)
    record = RunStore().create("failed", exit_code=1, stderr_tail=list(outcome.stderr_tail))
    assert run(["runs", "show", record.id]) == 0
    assert "d.jsonl line 100: not JSON" in capsys.readouterr().out


def test_a_ranks_named_error_is_the_runs_reason_and_its_echoes_go_to_the_log(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Disk full on the drafter: its one line is shown and kept as the reason; the peer that lost it and
    torchrun's ChildFailedError summary (~150 lines) go to the stop log, not the terminal."""
    import sys

    from dflash_doctor.launch.supervise import run_torchrun
    from trainer.runspec.outputs import error_line

    named = error_line(1, "no space left on the device for /o/checkpoints/step_00000020: it needs 2.6 MB")
    script = (
        "import sys, time\n"
        "print('dflash trainer: rank 1 (drafter) ready in 2.0 s', file=sys.stderr, flush=True)\n"
        f"print({named!r}, file=sys.stderr, flush=True)\n"
        "time.sleep(0.2)\n"
        "print('dflash trainer: rank 0: lost drafter rank 1 while sending a batch', file=sys.stderr)\n"
        "print('Traceback (most recent call last):', file=sys.stderr)\n"
        "print('torch.distributed.elastic.multiprocessing.errors.ChildFailedError:', file=sys.stderr)\n"
        "sys.exit(1)\n"
    )
    log = tmp_path / "stop.log"
    outcome = run_torchrun([sys.executable, "-c", script], {}, stop_log=log)
    err = capfd.readouterr().err
    assert outcome.exit_code == 1 and outcome.reason == named.split("error: ", 1)[1]
    assert named in err and "ChildFailedError" not in err and "lost drafter" not in err
    assert "ChildFailedError" in log.read_text() and "lost drafter rank 1" in log.read_text()


def test_a_failed_runs_record_keeps_its_reason_and_runs_show_leads_with_it(capsys) -> None:
    record = RunStore().create("failed", exit_code=1, reason="rank 1: no space left on the device for /o")
    assert RunStore().load(record.id).reason == "rank 1: no space left on the device for /o"
    assert run(["runs", "show", record.id]) == 0
    assert "why it failed: rank 1: no space left on the device for /o" in capsys.readouterr().out


def test_a_runs_throughput_is_the_steady_figure_and_an_older_record_says_what_its_figure_was(
    tmp_path, capsys
) -> None:
    store = RunStore(tmp_path / "runs")
    new = store.create(
        "succeeded", metrics={"steady_tok_s": 14329.0, "mean_tok_s": 14441.0, "steady_steps": [6, 60]}
    )
    old = store.create("succeeded", metrics={"mean_tok_s": 16927.0})
    assert new.tokens_per_second == 14329.0  # tokens / seconds, not the mean of rates beside it
    assert old.tokens_per_second == 16927.0
    from dflash_doctor.commands.runs import METRIC_LABELS

    assert "older record" in METRIC_LABELS["mean_tok_s"] and METRIC_LABELS["steady_tok_s"] == "tok/s"


@pytest.mark.parametrize(
    ("status", "notes", "says"),
    [
        (
            "failed",
            ["the launcher failed: SystemExit: 1"],
            "no exit code: the launcher failed (SystemExit: 1)",
        ),
        ("refused", [], "no exit code: nothing was started"),
        ("running", [], "no exit code yet: still running"),
        # worded for torchrun and for a lone rank started without it (launch/direct.py) alike
        ("interrupted", [], "no exit code: stopped before the workers started"),
        ("failed", [], "no exit code: the launcher failed before the workers ended"),
    ],
)
def test_runs_show_never_prints_exit_none_but_says_why_there_is_no_exit_code(
    capsys: pytest.CaptureFixture[str], status: str, notes: list[str], says: str
) -> None:
    record = RunStore().create(status, notes=notes)  # no launcher pid: a `running` record stays running
    assert run(["runs", "show", record.id]) == 0
    shown = capsys.readouterr().out
    assert "exit None" not in shown
    assert says in shown.splitlines()[0], shown


def test_an_empty_run_id_is_named_not_called_ambiguous(capsys: pytest.CaptureFixture[str]) -> None:
    store = RunStore()
    first, _ = store.create("succeeded"), store.create("succeeded")
    assert run(["runs", "compare", "", first.id]) == 2
    err = capsys.readouterr().err
    assert "ambiguous" not in err and "an empty run id" in err, err
    assert run(["runs", "show", ""]) == 2
    assert "an empty run id" in capsys.readouterr().err


def test_a_v1_record_reads_its_forced_findings_from_overrides(capsys) -> None:
    """v1 named the failing findings forced over with --force `overrides`; a record written then still reads,
    as the same record, and is written back in the current schema."""
    store = RunStore()
    old = {
        "schema": "dflash-doctor/run/v1", "id": "20240101-000000-abcd", "created": 1.0, "status": "failed",
        "overrides": ["hazards.preload"], "exit_code": 1, "finished": 2.0,
    }  # fmt: skip
    store.path(old["id"]).parent.mkdir(parents=True)
    store.path(old["id"]).write_text(json.dumps(old))
    record = store.load(old["id"])
    assert record.forced_findings == ["hazards.preload"] and record.exit_code == 1
    assert run(["runs", "show", old["id"]]) == 0
    assert "launched over failing findings (--force): hazards.preload" in capsys.readouterr().out
    store.save(record)
    written = json.loads(store.path(old["id"]).read_text())
    assert written["schema"] == "dflash-doctor/run/v2" and written["forced_findings"] == ["hazards.preload"]
    assert "overrides" not in written and store.load(old["id"]).forced_findings == ["hazards.preload"]


def test_an_unknown_record_schema_is_damaged(home: Path) -> None:
    store = RunStore()
    path = store.path("20240101-000000-beef")
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps({"schema": "dflash-doctor/run/v9", "id": "x", "created": 1.0, "status": "failed"})
    )
    assert store.all() == []
