"""SIGTERM or SIGINT to `train`: torchrun and every worker stop (none is left behind, even one that
ignores the signal), the run is recorded `interrupted` with its last metrics, the exit code is 128+signal,
and the stop's tracebacks stay out of the terminal. A record whose launcher vanished reads as `lost`.

The launcher runs for real in a child process (`dflash-doctor train` with the gate's heavy parts stubbed);
torchrun is a stand-in that, like torchrun, starts each worker in a session of its own.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from dflash_doctor.cli import run
from dflash_doctor.launch.runs import RunStore, this_launcher
from dflash_doctor.launch.supervise import ProcessTree

REPO = Path(__file__).resolve().parents[2]

# A torchrun stand-in: two workers in their own sessions; the second ignores SIGINT and SIGTERM, so only
# the launcher's kill after the grace period ends it. Each worker writes a metrics line, then waits.
WORKER = r"""
import json, signal, sys, time
from pathlib import Path
out, stubborn = Path(sys.argv[1]), sys.argv[2] == "1"
if stubborn:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").write_text(json.dumps({"step": 3, "loss": 1.5}) + "\n")
print("worker ready", flush=True)
try:
    time.sleep(600)
except KeyboardInterrupt:
    raise  # a traceback on stderr, as a real worker's: it must not reach the terminal
"""
TORCHRUN = r"""
import subprocess, sys, time
from pathlib import Path
out, pids = sys.argv[1], Path(sys.argv[2])
workers = [
    subprocess.Popen([sys.executable, "-c", sys.argv[3], out, flag], start_new_session=True)
    for flag in ("0", "1")
]
pids.write_text(" ".join(str(w.pid) for w in workers))
for w in workers:
    w.wait()
"""
DRIVER = r"""
import sys
from dflash_doctor.launch import lifecycle as train
from dflash_doctor.launch import supervise
from dflash_doctor.launch.compile_cache import CachePreparation
from dflash_doctor.cli import main

supervise.STOP_GRACE_S = 3.0
pids, torchrun_code, worker_code = sys.argv[1], sys.argv[2], sys.argv[3]
real = train.run_torchrun

def fake_torchrun(command, environ, **kwargs):
    out = command[command.index("--set") + 1].partition("=")[2].strip("'")
    return real([sys.executable, "-c", torchrun_code, out, pids, worker_code], environ, **kwargs)

train.run_torchrun = fake_torchrun
train.prepare_compile_cache = lambda *a, **k: CachePreparation("warm", "stub", 0.0)
train.snapshot_after_success = lambda *a, **k: "no snapshot in this test"
sys.argv = ["dflash-doctor", *sys.argv[4:]]
main()
"""


def start_train(tmp_path: Path) -> tuple[subprocess.Popen[str], Path, Path]:
    out = tmp_path / "out"
    pids = tmp_path / "pids"
    args = ["train", "--config", "tiny-cpu", "--no-deep", "--set", f"output.dir='{out}'"]
    env = {**os.environ, "DFLASH_DOCTOR_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    for name in ("TORCHDYNAMO_SUPPRESS_ERRORS", "TORCHINDUCTOR_FORCE_DISABLE_CACHES"):
        env.pop(name, None)
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(pids), TORCHRUN, WORKER, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the test's own terminal signals never reach it
    )
    return proc, pids, out


def interactive_signals() -> None:
    """A terminal's job has SIGINT and SIGQUIT at their defaults; a child of a shell's background job (`cmd &`,
    as when the suite itself runs in the background) inherits them ignored, and `tee` would then outlive the
    Ctrl-C the test sends. Run in the child before exec."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def wait_for(predicate, seconds: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_torchrun_and_every_worker_and_records_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: signal.Signals
) -> None:
    proc, pids, out = start_train(tmp_path)
    workers: list[int] = []
    try:
        assert wait_for(lambda: pids.is_file() and len(pids.read_text().split()) == 2, 60), "no workers"
        workers = [int(p) for p in pids.read_text().split()]
        assert wait_for(lambda: (out / "metrics.jsonl").is_file(), 30)
        time.sleep(0.5)  # the stubborn worker has installed its SIG_IGN
        proc.send_signal(signum)  # to the launcher alone, as `kill` or a scheduler would
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        for pid in workers:  # reap even when an assertion failed
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signum, stdout + stderr
    assert not [pid for pid in workers if alive(pid)], "a worker outlived the launch"
    assert "Traceback" not in stdout + stderr  # the workers' tracebacks went to the stop log
    assert f"stopping the run ({signum.name})" in stdout
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    (record,) = RunStore().all()
    assert record.status == "interrupted" and record.exit_code == 128 + signum
    assert record.metrics == {"last_step": {"step": 3, "loss": 1.5}}
    assert any("1 process(es) still running after the grace period were killed" in n for n in record.notes)
    assert not (out / ".dflash-run.owner.json").exists()  # the output folder was released


def test_ctrl_c_on_train_piped_into_tee_is_the_same_clean_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dflash-doctor train ... | tee log`, then Ctrl-C: the terminal signals the whole process group, so `tee`
    dies with the launcher's stdout pipe while the launcher is stopping. The launcher must still stop every
    worker, record `interrupted` and exit 130, saying the stop on stderr once stdout has no reader."""
    out, pids, log = tmp_path / "out", tmp_path / "pids", tmp_path / "log"
    args = ["train", "--config", "tiny-cpu", "--no-deep", "--set", f"output.dir='{out}'"]
    env = {**os.environ, "DFLASH_DOCTOR_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    tee = subprocess.Popen(
        ["tee", str(log)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        process_group=0,
        preexec_fn=interactive_signals,
    )
    assert tee.stdin is not None
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(pids), TORCHRUN, WORKER, *args],
        env=env,
        stdout=tee.stdin,
        stderr=subprocess.PIPE,
        text=True,
        process_group=tee.pid,  # one pipeline, one process group of its own: what a shell's Ctrl-C reaches
        preexec_fn=interactive_signals,
    )
    tee.stdin.close()  # the pipe's only writer is the launcher now
    workers: list[int] = []
    try:
        assert wait_for(lambda: pids.is_file() and len(pids.read_text().split()) == 2, 60), "no workers"
        workers = [int(p) for p in pids.read_text().split()]
        assert wait_for(lambda: (out / "metrics.jsonl").is_file(), 30)
        time.sleep(0.5)  # the stubborn worker has installed its SIG_IGN
        os.killpg(tee.pid, signal.SIGINT)  # Ctrl-C: the launcher and tee at once
        _, stderr = proc.communicate(timeout=60)
        tee.wait(timeout=10)
    finally:
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        for child in (proc, tee):
            if child.poll() is None:
                child.kill()
                child.wait()
    assert tee.returncode == -signal.SIGINT  # the pipe's reader really went away
    assert proc.returncode == 130, stderr
    assert not [pid for pid in workers if alive(pid)], "a worker outlived the launch"
    assert "stopping the run (SIGINT)" in stderr  # said where someone still reads
    assert "Traceback" not in stderr
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    (record,) = RunStore().all()
    assert record.status == "interrupted" and record.exit_code == 130, record.notes
    assert not (out / ".dflash-run.owner.json").exists()


def test_a_record_whose_launcher_is_gone_reads_as_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store = RunStore()
    gone = store.create("running", host=socket.gethostname(), launcher_pid=dead.pid, launcher_started=1.0)
    gone.last_seen = time.time() - 120
    store.save(gone)
    here = store.create("running", **this_launcher())
    statuses = {r.id: r.status for r in store.all()}
    assert statuses == {gone.id: "lost", here.id: "running"}
    assert run(["runs", "--json"]) == 0
    listed = {r["id"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    assert listed[gone.id]["status"] == "lost"
    assert run(["runs"]) == 0
    assert "lost" in capsys.readouterr().out


# The real chain: `train` -> torchrun -> two trainer ranks (gloo, CPU); only the compile-cache warm-up is
# stubbed (tests/cache covers it). Slow: the ranks import torch and compile their loss.
REAL_DRIVER = r"""
import sys
from dflash_doctor.launch import lifecycle as train
from dflash_doctor.launch.compile_cache import CachePreparation
from dflash_doctor.cli import main

train.prepare_compile_cache = lambda *a, **k: CachePreparation("warm", "stub", 0.0)
sys.argv = ["dflash-doctor", *sys.argv[1:]]
main()
"""


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_a_real_run_with_nothing_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: signal.Signals
) -> None:
    out = tmp_path / "out"
    sets = {
        "output.dir": f"'{out}'",
        "optim.steps": "100000",
        "data.seq_len": "64",
        "data.num_samples": "64",
        "optim.batch_size": "4",
        "optim.anchors": "16",
        "run.log_every": "1",
    }
    args = ["train", "--config", "tiny-cpu", "--no-deep"]
    args += [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    env = {**os.environ, "DFLASH_DOCTOR_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", REAL_DRIVER, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    tree = ProcessTree(proc.pid)  # the launcher and every descendant seen while it runs
    try:
        stdout, stderr = stop_once_trained(proc, tree.refresh, out / "metrics.jsonl", 3, signum)
    finally:
        left = [p.pid for p in tree.alive()]
        tree.kill_all()
    assert proc.returncode == 128 + signum, stdout[-2000:] + stderr[-2000:]
    assert left == [], f"left running: {left}"
    assert len(tree.known) >= 4  # the launcher, torchrun and two ranks were seen; none outlived the launch
    assert "Traceback" not in stdout + stderr
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    (record,) = RunStore().all()
    assert record.status == "interrupted" and record.exit_code == 128 + signum
    assert record.metrics.get("steps", 0) >= 3 or record.metrics.get("last_step", {}).get("step", 0) >= 3


def stop_once_trained(
    proc: subprocess.Popen[str], refresh: Callable[[], None], metrics: Path, lines: int, signum: int
) -> tuple[str, str]:
    """Send `signum` to a real launch once its `metrics` file has `lines` lines (`refresh` runs meanwhile, to
    see its processes); its output once it ended. Killed, never left running, if anything fails first."""
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            refresh()
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= lines:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before it could be stopped"
        proc.send_signal(signum)
        return proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
