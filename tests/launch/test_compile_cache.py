"""Before launch: the warm-up child sees the training shapes (overrides included) on every drafter device."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from dflash_base.errors import DoctorError
from dflash_doctor.cache.fingerprint import BuildFingerprint
from dflash_doctor.cache.warm import WarmShapes, child_command
from dflash_doctor.launch import compile_cache
from dflash_doctor.launch.compile_cache import _config_with_overrides
from trainer.runspec.config import load_config
from trainer.runspec.config_file import resolve_config_path

FINGERPRINT = BuildFingerprint("2.11.0+cu130", "70d99e998b49", "13.0", "3.6.0", "3.12", ("NVIDIA H200",))


def test_overrides_reach_the_warm_up_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    path = resolve_config_path("tiny-cpu")
    overrides = [
        "optim.anchors=32",
        "drafter.block_size=4",
        "output.dir='/tmp/x y'",
        "drafter.flex_kernel_options={USE_TMA=true, bwd_BLOCK_M1=32}",  # a table: written as an inline table
    ]
    written = _config_with_overrides(path, tuple(overrides))
    assert written != path
    assert load_config(written) == load_config(path, overrides)
    assert _config_with_overrides(path, ()) == path


def _temp_leftovers() -> list[str]:
    return sorted(p.name for p in Path(tempfile.gettempdir()).glob("dflash-warm-*"))


def test_the_overridden_config_lives_in_the_home_and_is_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One file per distinct content under the home, the same path for the same overrides: nothing in /tmp."""
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    before = _temp_leftovers()
    path = resolve_config_path("tiny-cpu")
    first = _config_with_overrides(path, ("optim.steps=7",))
    again = _config_with_overrides(path, ("optim.steps=7",))
    other = _config_with_overrides(path, ("optim.steps=8",))
    assert first == again != other
    assert first.parent == tmp_path / "home" / "cache" / "warm-configs"
    assert sorted(p.name for p in first.parent.iterdir()) == sorted([first.name, other.name])  # no temp files
    assert _temp_leftovers() == before


def test_unused_warm_up_configs_are_pruned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    path = resolve_config_path("tiny-cpu")
    old = _config_with_overrides(path, ("optim.steps=7",))
    recent = _config_with_overrides(path, ("optim.steps=8",))
    week_ago = time.time() - compile_cache.WARM_CONFIG_MAX_AGE_S - 60
    os.utime(old, (week_ago, week_ago))
    os.utime(recent, (week_ago, week_ago))
    assert _config_with_overrides(path, ("optim.steps=8",)) == recent  # reused: its age starts again
    assert recent.exists() and not old.exists()


def test_a_failed_warm_up_leaves_no_temp_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The story's leak: every launch with `--set` left a `/tmp/dflash-warm-*` folder, also when the
    warm-up child failed. The launch fails with the child's error; nothing is left in the temp folder."""
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(compile_cache, "current_fingerprint", lambda env: FINGERPRINT)
    seen: list[Path] = []

    def failing_child(command: list[str], environ: dict[str, str]) -> dict:
        seen.append(Path(command[command.index("--config") + 1]))
        raise DoctorError("the warm-up child failed (exit 1)")

    monkeypatch.setattr(compile_cache, "run_warm_child", failing_child)
    before = _temp_leftovers()
    environ = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    env = SimpleNamespace(interpreter=SimpleNamespace(executable=sys.executable))
    with pytest.raises(DoctorError, match="warm-up child failed"):
        compile_cache.prepare_compile_cache(
            env, environ, resolve_config_path("tiny-cpu"), "cpu", (), ("optim.steps=7",)
        )  # type: ignore[arg-type]
    assert _temp_leftovers() == before
    assert seen and seen[0].parent == tmp_path / "home" / "cache" / "warm-configs"


def test_child_warms_each_drafter_device_in_turn() -> None:
    command = child_command(
        "/py", "cuda", WarmShapes(), config=Path("/c.toml"), trainer_devices=("cuda:5", "cuda:6")
    )
    assert command[command.index("--config") + 1] == "/c.toml"
    assert [command[i + 1] for i, a in enumerate(command) if a == "--trainer-device"] == ["cuda:5", "cuda:6"]
    assert "--trainer-device" not in child_command("/py", "cpu", WarmShapes(), trainer_devices=("cuda:1",))


def test_ctrl_c_stops_the_launch_and_every_worker(tmp_path: Path) -> None:
    """SIGINT to the foreground group (what Ctrl-C does): the launcher waits for torchrun's own shutdown,
    escalates if it lingers, and reports the run as interrupted; no worker survives."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pids = tmp_path / "worker.pid"
    # A stand-in for torchrun whose "worker" ignores SIGINT, so the launcher must escalate.
    worker = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(120)"
    fake_torchrun = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', {worker!r}])\n"
        f"open({str(pids)!r}, 'w').write(str(p.pid))\n"
        "try:\n    p.wait()\nexcept KeyboardInterrupt:\n    p.terminate(); p.wait(); sys.exit(130)\n"
    )
    launcher = (
        "import sys\n"
        "from dflash_doctor.launch import supervise\n"
        "supervise.STOP_GRACE_S = 5\n"
        f"outcome = supervise.run_torchrun([sys.executable, '-c', {fake_torchrun!r}], {{}})\n"
        "print('RESULT', outcome.exit_code, outcome.interrupted)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", launcher],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    deadline = time.time() + 30
    while not pids.exists() and time.time() < deadline:
        time.sleep(0.1)
    assert pids.exists(), "the fake worker never started"
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground process group
    out, _ = proc.communicate(timeout=60)
    assert "RESULT 130 True" in out
    worker_pid = int(pids.read_text())
    time.sleep(0.2)
    try:
        os.kill(worker_pid, 0)
        alive = Path(f"/proc/{worker_pid}/stat").read_text().split()[2] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        alive = False
    assert not alive, "a worker outlived the launch"


def test_a_launch_that_changes_only_the_schedule_skips_the_warm_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39 U4: the warm-up record keyed on the whole config, so `optim.lr`, `eval.every`,
    `checkpoint.every` or `run.log_every` alone made the next launch compile again. Only what reaches a
    compiled graph keys it: a shape (`optim.anchors`) still runs the child."""
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(compile_cache, "current_fingerprint", lambda env: FINGERPRINT)
    inductor = tmp_path / "inductor"
    ran: list[list[str]] = []

    def child(command: list[str], environ: dict[str, str]) -> dict:
        ran.append(command)
        (inductor / "fxgraph").mkdir(parents=True, exist_ok=True)
        (inductor / "fxgraph" / f"graph{len(ran)}").write_bytes(b"compiled")  # what a compile leaves
        return {"first_call_seconds": 1.0, "counters": {"inductor": {"fxgraph_cache_miss": 1}}}

    monkeypatch.setattr(compile_cache, "run_warm_child", child)
    environ = {"TORCHINDUCTOR_CACHE_DIR": str(inductor)}
    env = SimpleNamespace(interpreter=SimpleNamespace(executable=sys.executable))

    def launch(*overrides: str) -> str:
        return compile_cache.prepare_compile_cache(
            env,
            environ,
            resolve_config_path("tiny-cpu"),
            "cpu",
            (),
            overrides,  # type: ignore[arg-type]
        ).detail

    launch()
    assert len(ran) == 1
    schedule = ("optim.lr=1e-3", "optim.warmup_ratio=0.1", "optim.grad_clip=0.5", "eval.every=7",
                "checkpoint.every=3", "run.log_every=2", "optim.steps=50")  # fmt: skip
    assert "warm-up skipped" in launch(*schedule)
    assert len(ran) == 1, "a schedule-only change ran the warm-up child again"
    assert "warm-up skipped" not in launch("optim.anchors=32")
    assert len(ran) == 2


def test_the_warm_up_runs_at_the_thread_count_torchrun_gives_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39 U4: torchrun sets OMP_NUM_THREADS=1 in its workers when it starts several on a node; a
    warm-up at another thread count compiled C++ kernels no worker could use. The child gets the workers'
    count, and the record keys on it (a 1-process launch's warm-up does not stand for a 2-process one)."""
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(compile_cache, "current_fingerprint", lambda env: FINGERPRINT)
    inductor = tmp_path / "inductor"
    threads: list[str | None] = []

    def child(command: list[str], environ: dict[str, str]) -> dict:
        threads.append(environ.get("OMP_NUM_THREADS"))
        (inductor / "fxgraph").mkdir(parents=True, exist_ok=True)
        (inductor / "fxgraph" / f"graph{len(threads)}").write_bytes(b"compiled")
        return {"first_call_seconds": 1.0}

    monkeypatch.setattr(compile_cache, "run_warm_child", child)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    environ = {"TORCHINDUCTOR_CACHE_DIR": str(inductor)}
    env = SimpleNamespace(interpreter=SimpleNamespace(executable=sys.executable))
    config = resolve_config_path("tiny-cpu")
    for workers in (2, 1, 2):
        compile_cache.prepare_compile_cache(env, environ, config, "cpu", (), (), workers)  # type: ignore[arg-type]
    assert threads == ["1", None]  # the third launch found the first one's record
    mine = {**environ, "OMP_NUM_THREADS": "3"}
    assert compile_cache.as_workers_see_it(mine, 2) == mine  # set by the user: torchrun keeps it too
