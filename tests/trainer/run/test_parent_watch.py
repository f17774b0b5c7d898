"""Issue 18, row 17: a rank whose torchrun is killed outright stops itself instead of sleeping for ever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[3]

# parent -> child; the child is a "rank": stop handlers, the watch, then a hang (as drafter_hang_at_step).
RANK = r"""
import sys, time
from dflash_base.stopping import Stopped, install_stop_handlers
from trainer.run.parent_watch import watch_parent
install_stop_handlers()
watch_parent(grace_s=5, poll_s=0.1)
print("ready", flush=True)
try:
    while True:
        time.sleep(3600)
except Stopped as stop:
    open(sys.argv[1], "w").write(str(stop))
    sys.exit(stop.exit_code)
"""
PARENT = r"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""


def test_a_rank_whose_parent_was_killed_stops_within_seconds(tmp_path: Path) -> None:
    said = tmp_path / "said"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, RANK, str(said)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert parent.stdout is not None
    rank = psutil.Process(int(parent.stdout.readline()))
    try:
        time.sleep(1.5)  # the rank has started its watch
        parent.send_signal(signal.SIGKILL)  # torchrun killed outright: the rank is re-parented
        parent.wait()
        rank.wait(timeout=15)
    finally:
        if rank.is_running():
            rank.kill()
    assert said.read_text() == "stopped by SIGTERM"  # unwound through the stop handlers, finally blocks ran


def test_a_second_stop_signal_does_not_cut_the_unwinding_short(tmp_path: Path) -> None:
    """torchrun and `train` both signal a rank: the second SIGTERM, arriving in the middle of the `finally`
    that writes the summary, must not abort it."""
    done = tmp_path / "summary"
    rank = r"""
import os, signal, sys, time
from dflash_base.stopping import Stopped, install_stop_handlers
install_stop_handlers()
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
except Stopped:
    os.kill(os.getpid(), signal.SIGTERM)  # the second one, in the middle of the cleanup
    time.sleep(0.2)
    open(sys.argv[1], "w").write("written")
"""
    proc = subprocess.run(
        [sys.executable, "-c", rank, str(done)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.read_text() == "written", proc.stderr
