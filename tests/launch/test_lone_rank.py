"""A lone rank is its own warm-up (issue 40 §2): `train` starts it beside the gate, it compiles and reports, and
it trains only on the launcher's go, given once the whole gate passed. Fast: the rank here is a stand-in that
speaks the rank's side of the link (`dflash_base/go_link.py`) and does nothing else; the gate, the lock, the
warm-up record, the record and the supervision are the real ones. tests/launch/test_lone_rank_runs.py runs the
real trainer."""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from dflash_base.go_link import LauncherLink, RankLink
from dflash_doctor import registry
from dflash_doctor.cli import run
from dflash_doctor.findings import Finding, Severity
from dflash_doctor.launch import lifecycle
from dflash_doctor.launch.lone_rank import SEPARATE_ENV, LoneRank
from dflash_doctor.launch.output_lock import OutputLock
from dflash_doctor.launch.runs import RunStore
from dflash_doctor.launch.timeline import BESIDE_THE_RANK, EARLY_PHASES

ONE = ["--set", 'topology.mode="colocated"']  # tiny-cpu colocated on CPU: one process in all
LATE_STATIC = (
    "ownership.clobbered"  # a static check outside gate.WARM_UP_NEEDS: it runs after the rank starts
)

# The rank's side of the link and nothing else: it reports a compile (a file in the compile cache, as a
# compile leaves), waits for the go and "trains" (a metrics line). FAKE_MODE: ready | fail | die.
FAKE_RANK = r"""
import os, sys, time
from pathlib import Path
from dflash_base import timeline
from dflash_base.go_link import RankLink
from dflash_base.stopping import Stopped, install_stop_handlers

folder, mode = Path(os.environ["FAKE_DIR"]), os.environ["FAKE_MODE"]
(folder / "pid").write_text(str(os.getpid()))
install_stop_handlers()
link = RankLink.from_environ()
assert link is not None and "DFLASH_DOCTOR_GO_FD" not in os.environ
link.watch(grace_s=5)
link.hold_stdout()
try:
    for phase in ("worker spawn", "worker start", "imports", "process group", "model build"):
        timeline.mark(phase)
    print("fake rank: held until the go")
    print("fake rank: a compile warning", file=sys.stderr, flush=True)
    if mode == "die":
        print("fake rank: died before its compile", file=sys.stderr, flush=True)
        sys.exit(3)
    with link.compiling():
        if mode == "fail":
            raise RuntimeError("C++ compile failed\ncc1plus: fatal error: no such file")
        artifact = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / "fxgraph" / "ab" / "fake-graph"
        artifact.parent.mkdir(parents=True, exist_ok=True)
        artifact.write_text("compiled")
    timeline.mark("compile")
    link.ready({"fxgraph_cache_miss": 2, "fxgraph_cache_hit": 0, "seconds": 0.1, "at": time.time()})
    (folder / "ready").write_text("1")
    link.wait_for_go()
    timeline.mark("go wait")
    (folder / "went").write_text("1")
    out = Path(os.environ["FAKE_OUT"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    timeline.mark("first step")
except Stopped as stop:
    sys.exit(stop.exit_code)
"""


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The tool's state in tmp; no snapshot after the run (tests/cache covers it)."""
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(SEPARATE_ENV, raising=False)
    for name in ("TORCHDYNAMO_SUPPRESS_ERRORS", "TORCHINDUCTOR_FORCE_DISABLE_CACHES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(lifecycle, "snapshot_after_success", lambda *a, **k: "snapshot skipped in test")
    return tmp_path / "home"


@dataclasses.dataclass
class Fake:
    folder: Path
    commands: list[list[str]]

    @property
    def pid(self) -> int:
        return int((self.folder / "pid").read_text())

    def wait(self, name: str, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while not (self.folder / name).is_file() and time.monotonic() < deadline:
            time.sleep(0.05)
        return (self.folder / name).is_file()


def fake_rank(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mode: str = "ready") -> Fake:
    """The launcher starts the stand-in where it would start `python -m trainer ...` (recorded)."""
    folder = tmp_path / "fake"
    folder.mkdir()
    fake = Fake(folder, [])
    real = LoneRank.start.__func__  # type: ignore[attr-defined]

    def start(
        cls: type[LoneRank], command: list[str], environ: dict[str, str], *args: Any, **kwargs: Any
    ) -> LoneRank:
        fake.commands.append(command)
        environ = {**environ, "FAKE_DIR": str(folder), "FAKE_MODE": mode, "FAKE_OUT": str(tmp_path / "out")}
        return real(cls, [sys.executable, "-c", FAKE_RANK], environ, *args, **kwargs)

    monkeypatch.setattr(LoneRank, "start", classmethod(start))
    return fake


def late_check(monkeypatch: pytest.MonkeyPatch, fn: Any) -> None:
    registry.all_checks()  # the check modules register themselves on first use
    original = registry._CHECKS[LATE_STATIC]
    monkeypatch.setitem(registry._CHECKS, LATE_STATIC, dataclasses.replace(original, fn=fn))


def args(tmp_path: Path, *more: str) -> list[str]:
    return [
        "train",
        "--config",
        "tiny-cpu",
        "--no-deep",
        *ONE,
        "--set",
        f"output.dir={json.dumps(str(tmp_path / 'out'))}",
        *more,
    ]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_rank_compiles_beside_the_gate_and_trains_only_on_its_go(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    fake = fake_rank(monkeypatch, tmp_path)
    seen: dict[str, bool] = {}

    def slow_late(ctx):  # type: ignore[no-untyped-def]
        seen["rank compiled during the gate"] = fake.wait("ready")
        seen["no go during the gate"] = not (fake.folder / "went").exists()
        seen["output.dir locked during the gate"] = (tmp_path / "out" / ".dflash-run.owner.json").is_file()
        return iter(())

    late_check(monkeypatch, slow_late)
    assert run(args(tmp_path)) == 0
    captured = capfd.readouterr()  # the rank writes to the launcher's file descriptors
    assert all(seen.values()) and len(seen) == 3, seen
    assert (fake.folder / "went").is_file() and gone(fake.pid)
    (record,) = RunStore().all()
    run_json = record.to_json()
    (command,) = fake.commands
    assert command == run_json["command"] and command[1:3] == ["-m", "trainer"]  # the plan's, started early
    assert run_json["status"] == "succeeded" and run_json["exit_code"] == 0
    notes = run_json["notes"]
    assert any(
        n.startswith("compile cache: warmed: the rank compiled for itself beside the gate") for n in notes
    )
    assert any(n.startswith("before the rank: ") and "started beside the gate" in n for n in notes)
    # what the rank wrote before its go reached the terminal only after it: held, then shown
    shown = captured.out + captured.err
    assert "fake rank: held until the go" in shown and "fake rank: a compile warning" in shown
    assert not (tmp_path / "out" / ".dflash-run.owner.json").exists()  # the output folder was released
    # the warm-up record, as the child's: the next launch of this config skips the warm-up
    records = json.loads((home / "cache" / "warm-records.json").read_text())["records"]
    assert len(records) == 1 and any(path.endswith("fake-graph") for path in records[0]["files"])
    timeline = run_json["timeline"]
    assert [row["phase"] for row in timeline["phases"]] == list(EARLY_PHASES)
    assert [row["phase"] for row in timeline["beside"]] == list(BESIDE_THE_RANK)
    rows = timeline["phases"]
    assert all(a["end_s"] == b["start_s"] for a, b in itertools.pairwise(rows))
    assert timeline["first_step_s"] == rows[-1]["end_s"]


def test_the_host_memory_the_plan_is_judged_against_is_read_before_the_rank_starts(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone rank builds its models while `launch.memory` may still run: the host's available memory it is
    judged against is read once, before the gate starts anything, never with our own rank counted in it."""
    from dflash_doctor.launch import gate

    fake = fake_rank(monkeypatch, tmp_path)
    reads: list[bool] = []

    def available() -> int:
        reads.append((fake.folder / "pid").exists())  # had the rank started?
        return 64 * 1024**3

    monkeypatch.setattr(gate, "host_available_bytes", available)

    def after_the_rank_compiled(ctx):  # type: ignore[no-untyped-def]
        assert fake.wait("ready")  # launch.memory and the rest ran while the rank was up
        return iter(())

    late_check(monkeypatch, after_the_rank_compiled)
    assert run(args(tmp_path)) == 0
    assert reads == [False]
    (record,) = RunStore().all()
    (memory,) = [f for f in record.findings if f["id"] == "launch.memory"]
    assert memory["evidence"]["available"] == "64.0 GiB"


def test_a_failing_check_the_compile_depends_on_starts_no_rank(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_rank(monkeypatch, tmp_path)

    def unsafe_cache(ctx):  # type: ignore[no-untyped-def]
        yield Finding("cache.permissions", Severity.FAIL, "the cache is writable by others", {}, "chmod 700")

    registry.all_checks()
    original = registry._CHECKS["cache.permissions"]
    monkeypatch.setitem(registry._CHECKS, "cache.permissions", dataclasses.replace(original, fn=unsafe_cache))
    assert run(args(tmp_path)) == 1
    assert fake.commands == [] and not (tmp_path / "out").exists()
    assert [r.status for r in RunStore().all()] == ["refused"]


def test_v_prints_the_rank_on_the_path_and_the_gate_beside_it(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_rank(monkeypatch, tmp_path)
    assert run(["-v", *args(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "rank start" in out and "go wait" in out
    assert "(beside the rank, not on the path)" in " ".join(out.split())


def test_the_second_launch_skips_the_warm_up_and_says_so(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_rank(monkeypatch, tmp_path)
    assert run(args(tmp_path)) == 0
    assert run(args(tmp_path)) == 0
    first, second = RunStore().all()
    assert any("the rank compiled for itself beside the gate" in n for n in first.notes)
    skipped = [n for n in second.notes if n.startswith("compile cache: ")]
    assert "warm-up skipped" in skipped[0] and "the rank loaded its graphs beside the gate" in skipped[0]


def test_a_check_failing_after_the_rank_started_refuses_and_stops_it(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = fake_rank(monkeypatch, tmp_path)

    def failing_late(ctx):  # type: ignore[no-untyped-def]
        assert fake.wait("ready")  # the rank compiled and waits
        yield Finding(LATE_STATIC, Severity.FAIL, "torch's files no longer match its RECORD", {}, "reinstall")

    late_check(monkeypatch, failing_late)
    assert run(args(tmp_path)) == 1
    out = capsys.readouterr()
    assert "launch refused" in out.out and "Nothing was started" in out.out
    assert "fake rank" not in out.out + out.err  # nothing of the stopped rank reached the terminal
    assert gone(fake.pid) and not (fake.folder / "went").exists()
    assert not (tmp_path / "out").exists()  # the lock made the folder: removed with it
    (record,) = RunStore().all()
    assert record.status == "refused" and record.command[1:3] == ["-m", "trainer"]
    assert sorted(p.name for p in RunStore().path(record.id).parent.iterdir()) == ["record.json"]
    assert not (home / "cache" / "warm-records.json").exists()


def test_a_refusal_leaves_an_output_folder_that_was_there_as_it_was(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_rank(monkeypatch, tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")

    def failing_late(ctx):  # type: ignore[no-untyped-def]
        fake.wait("ready")
        yield Finding(LATE_STATIC, Severity.FAIL, "planted", {}, "fix")

    late_check(monkeypatch, failing_late)
    assert run(args(tmp_path)) == 1
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) in (
        ["notes.txt"],
        [".dflash-run.lock", "notes.txt"],
    )
    again = OutputLock(tmp_path / "out")
    again.acquire("next", 1)  # free again: no DoctorError
    again.release()


def test_a_compile_that_fails_in_the_rank_is_the_warm_ups_failure(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = fake_rank(monkeypatch, tmp_path, mode="fail")
    assert run(args(tmp_path)) == 2  # as a failed warm-up child: exit 2, a clear line
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "warm-up failed in the rank, which compiles for itself (exit 1): RuntimeError: cc1plus: fatal error"
        in err
    )
    assert f"{SEPARATE_ENV}=1" in err
    (record,) = RunStore().all()
    assert record.status == "failed" and any("warm-up failed in the rank" in n for n in record.notes)
    log = (RunStore().path(record.id).parent / "stop.log").read_text()
    assert "Traceback" in log and "C++ compile failed" in log  # the rank's whole output, kept
    assert gone(fake.pid) and not (fake.folder / "went").exists()
    assert not (home / "cache" / "warm-records.json").exists()
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_a_rank_that_ends_before_its_compile_fails_the_run_with_why(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a rank that failed after the warm-up child did: the run `failed`, the rank's exit code and its last
    lines in the record, what it wrote shown once the gate passed."""
    fake_rank(monkeypatch, tmp_path, mode="die")
    assert run(args(tmp_path)) == 1
    assert "fake rank: died before its compile" in capsys.readouterr().err
    (record,) = RunStore().all()
    assert record.status == "failed" and record.exit_code == 3
    assert "fake rank: died before its compile" in record.stderr_tail
    assert any("the rank ended (exit 3) before its compile was done" in n for n in record.notes)
    assert not (home / "cache" / "warm-records.json").exists()


def test_an_output_folder_another_run_holds_starts_no_rank_and_refuses_as_before(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = fake_rank(monkeypatch, tmp_path)
    monkeypatch.setattr(
        lifecycle, "prepare_compile_cache", lambda *a, **k: lifecycle.CachePreparation("warm", "stub", 0.0)
    )
    other = OutputLock(tmp_path / "out")
    other.acquire("20990101-000000-beef", 4242)
    try:
        assert run(args(tmp_path)) == 2
        assert other.owner_path.is_file()  # the holder's note is its own: never removed by the one refused
    finally:
        other.release()
    assert "is in use by run 20990101-000000-beef" in " ".join(capsys.readouterr().err.split())
    assert fake.commands == [] and RunStore().all() == []


def test_the_way_back_keeps_the_separate_warm_up_child(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_rank(monkeypatch, tmp_path)
    monkeypatch.setenv(SEPARATE_ENV, "1")
    warmed: list[bool] = []
    started: list[list[str]] = []

    def prepare(*a: object, **k: object) -> lifecycle.CachePreparation:
        warmed.append(True)
        return lifecycle.CachePreparation("warm", "stub", 0.0)

    def torchrun(command: list[str], environ: dict[str, str], **kwargs: object) -> lifecycle.TorchrunOutcome:
        started.append(command)
        return lifecycle.TorchrunOutcome(0)

    monkeypatch.setattr(lifecycle, "prepare_compile_cache", prepare)
    monkeypatch.setattr(lifecycle, "run_torchrun", torchrun)
    assert run(args(tmp_path)) == 0
    assert warmed == [True] and fake.commands == [] and started[0][1:3] == ["-m", "trainer"]


def test_the_launchers_end_closing_stops_a_rank_waiting_for_its_go(tmp_path: Path) -> None:
    """The launcher killed outright closes its end: the rank's watch sees end-of-file and stops it."""
    import subprocess

    link = LauncherLink.pair()
    script = (
        "import os, sys, time\n"
        "from dflash_base.go_link import RankLink\n"
        "from dflash_base.stopping import Stopped, install_stop_handlers\n"
        "install_stop_handlers()\n"
        "link = RankLink.from_environ(); link.watch(grace_s=5)\n"
        # the stop may land while `ready` is still returning: the whole rank is under the handler, as in
        # trainer/__main__.py (was: only the wait, and 7 of 20 runs on a loaded box ended 1)
        "try:\n    link.ready({})\n    link.wait_for_go()\n"
        "except Stopped as stop:\n    print('stopped', flush=True); sys.exit(stop.exit_code)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        env={**__import__("os").environ, "DFLASH_DOCTOR_GO_FD": str(link.child_fd)},
        pass_fds=(link.child_fd,),
        stdout=subprocess.PIPE,
        text=True,
    )
    link.child_started()
    assert "ready" in link.wait_report(lambda: proc.poll() is None)
    began = time.monotonic()
    link.close()
    out, _ = proc.communicate(timeout=15)
    assert time.monotonic() - began < 5
    assert proc.returncode == 143 and out.strip() == "stopped"


def test_a_rank_link_hands_back_the_held_stdout_only_on_the_go(monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import socket

    ours, theirs = socket.socketpair()
    real = io.StringIO()
    monkeypatch.setattr(sys, "stdout", real)
    link = RankLink(theirs)
    link.hold_stdout()
    print("before the go")
    assert real.getvalue() == ""
    link.go.set()
    link.wait_for_go()
    print("after the go")
    assert real.getvalue() == "before the go\nafter the go\n" and sys.stdout is real
    ours.close()
    theirs.close()


@pytest.fixture(autouse=True)
def _no_thread_left() -> Iterator[None]:
    before = {t.name for t in threading.enumerate()}
    yield
    left = {t.name for t in threading.enumerate() if t.is_alive()} - before
    assert not {"lone-rank-tree", "lone-rank"} & left, left
