"""The launch timeline (issue 40 §2): where each second from `train` to the first metrics line goes, in the
run record, in `--json` and, with `-v`, as a table; the first drafter's phases come through the run folder."""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path

import pytest

from dflash_base import timeline as base_timeline
from dflash_base.timeline import TIMELINE_ENV, append_mark, read_marks
from dflash_doctor.cli import run
from dflash_doctor.launch import lifecycle
from dflash_doctor.launch.runs import RunStore
from dflash_doctor.launch.supervise import TorchrunOutcome
from dflash_doctor.launch.timeline import PHASES, SPAWN_PHASES, WORKER_PHASES, LaunchTimeline
from tests.launch.test_train_gate import launches  # noqa: F401  (fixture)
from trainer.run.startup import StartupClock

ROOT = Path(__file__).resolve().parents[2]


def one_spawn(spawn: str = "torchrun start") -> list[str]:
    """The phases of one launch: torchrun's start, or a lone rank's own spawn (launch/direct.py), not both."""
    return [p for p in PHASES if p not in SPAWN_PHASES or p == spawn]


def assert_whole_and_monotone(data: dict, spawn: str = "torchrun start") -> None:
    rows = data["phases"]
    assert [r["phase"] for r in rows] == one_spawn(spawn)
    ends = [r["end_s"] for r in rows]
    assert ends == sorted(ends) and all(r["start_s"] <= r["end_s"] for r in rows)
    assert all(later["start_s"] == earlier["end_s"] for earlier, later in itertools.pairwise(rows))
    assert data["first_step_s"] == ends[-1] == pytest.approx(sum(r["seconds"] for r in rows), abs=0.01)


def test_the_workers_marks_join_the_launchers_in_launch_order(tmp_path: Path) -> None:
    line = LaunchTimeline(began=100.0)
    for offset, phase in enumerate(("launcher start", "gate", "deep probe", "warm-up"), start=1):
        line.mark(phase, 100.0 + offset)
    line.mark("gate", 150.0)  # the first mark of a phase counts
    environ = line.worker_environ({"A": "1"}, tmp_path)
    assert environ[TIMELINE_ENV] == str(tmp_path / "timeline.jsonl") and environ["A"] == "1"
    worker = [p for p in WORKER_PHASES if p != "worker spawn"]
    for offset, phase in enumerate(reversed(worker)):  # the order of the lines does not matter
        append_mark(environ[TIMELINE_ENV], phase, 120.0 - offset)
    with open(environ[TIMELINE_ENV], "a") as torn:
        torn.write('{"phase": "first st')  # a crash mid-line: skipped
    data = line.to_json()
    assert_whole_and_monotone(data)
    assert data["phases"][1] == {"phase": "gate", "start_s": 1.0, "end_s": 2.0, "seconds": 1.0}
    assert data["first_step_s"] == 20.0


def test_only_the_reporting_rank_writes_and_it_writes_what_it_remembered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "timeline.jsonl"
    monkeypatch.setenv(TIMELINE_ENV, str(path))
    base_timeline.remember("torchrun start")
    other = StartupClock()
    other.report_timeline(False)  # not the first drafter: forgets, writes nothing
    other.mark("process group")
    assert read_marks(path) == []

    base_timeline.remember("torchrun start")
    base_timeline.remember("imports")
    clock = StartupClock()
    clock.report_timeline(True)
    for phase in ("process group", "build target", "build", "compile", "optimizer + DDP"):
        clock.mark(phase)
    clock.timeline_mark("first step")
    marks = read_marks(path)
    assert [m["phase"] for m in marks] == [
        "torchrun start",
        "imports",
        "process group",
        "model build",
        "compile",
        "first step",
    ]
    assert all(m["pid"] == os.getpid() for m in marks)
    assert [m["at"] for m in marks] == sorted(m["at"] for m in marks)


def test_a_launch_records_its_timeline_in_json_and_prints_it_with_v(
    launches: list[list[str]],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seen: list[str] = []

    def torchrun_with_a_worker(
        command: list[str], environ: dict[str, str], **kwargs: object
    ) -> TorchrunOutcome:
        seen.append(environ[TIMELINE_ENV])  # the workers are told where to append
        for phase in WORKER_PHASES:
            if phase != "worker spawn":  # the default tiny-cpu launch is two processes: torchrun
                append_mark(environ[TIMELINE_ENV], phase)
        return TorchrunOutcome(0)

    monkeypatch.setattr(lifecycle, "run_torchrun", torchrun_with_a_worker)
    assert run(["train", "--config", "tiny-cpu", "--no-deep", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert_whole_and_monotone(document["run"]["timeline"])
    inside = document["run"]["timeline"]["inside"]  # the gate's own steps, where its seconds went
    assert list(inside) == ["environment", "GPUs and disk", "launch plan", "probe key", "warm-up checks"]
    assert list(inside.values()) == sorted(inside.values())
    gate_end = next(r["end_s"] for r in document["run"]["timeline"]["phases"] if r["phase"] == "gate")
    assert inside["warm-up checks"] <= gate_end
    record = RunStore().all()[-1]
    assert record.timeline == document["run"]["timeline"]
    assert Path(seen[0]).parent == RunStore().path(record.id).parent  # in the run's own folder

    assert run(["-v", "train", "--config", "tiny-cpu", "--no-deep"]) == 0
    out = capsys.readouterr().out
    assert "timeline (seconds" in " ".join(out.split())  # rich wraps the title at the test's width
    assert all(phase in out for phase in one_spawn())
    assert "inside (ends at)" in out and "warm-up checks" in out
    assert run(["train", "--config", "tiny-cpu", "--no-deep"]) == 0
    assert "timeline (seconds" not in " ".join(capsys.readouterr().out.split())  # only with -v


@pytest.mark.slow
def test_a_short_tiny_cpu_run_has_every_phase_in_order(tmp_path: Path) -> None:
    """The real thing: gate, probe, warm-up child, torchrun and the workers on CPU (a minute or more)."""
    import subprocess

    out = tmp_path / "out"
    sets = ["data.seq_len=64", "data.num_samples=32", "optim.batch_size=2", "optim.anchors=8"]
    sets += ["checkpoint.every=0", "optim.steps=2", f"output.dir={json.dumps(str(out))}"]
    command = [sys.executable, "-m", "dflash_doctor", "train", "--config", "tiny-cpu", "--json"]
    command += [arg for item in sets for arg in ("--set", item)]
    environ = {**os.environ, "DFLASH_DOCTOR_HOME": str(tmp_path / "home")}
    done = subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_whole_and_monotone(json.loads(done.stdout)["run"]["timeline"])


def test_a_lone_rank_started_directly_names_its_spawn_worker_spawn(tmp_path: Path) -> None:
    """A one-process launch has no torchrun: the phase before the rank's own code is "worker spawn"."""
    line = LaunchTimeline(began=100.0)
    for offset, phase in enumerate(("launcher start", "gate", "deep probe", "warm-up"), start=1):
        line.mark(phase, 100.0 + offset)
    environ = line.worker_environ({}, tmp_path)
    worker = [p for p in WORKER_PHASES if p != "torchrun start"]
    for offset, phase in enumerate(worker, start=5):
        append_mark(environ[TIMELINE_ENV], phase, 100.0 + offset)
    data = line.to_json()
    assert_whole_and_monotone(data, spawn="worker spawn")
    assert data["phases"][4] == {"phase": "worker spawn", "start_s": 4.0, "end_s": 5.0, "seconds": 1.0}
