"""Before launch: the warm-up child sees the training shapes (overrides included) on every drafter device."""

from __future__ import annotations

from pathlib import Path

from dflash_doctor.cache.warm import WarmShapes, child_command
from dflash_doctor.launch.launcher import _config_with_overrides
from trainer.config import load_config, resolve_config_path


def test_overrides_reach_the_warm_up_config() -> None:
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
