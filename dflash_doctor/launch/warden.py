"""A run's record closed even when its launcher is killed outright (SIGKILL, the OOM killer).

The launcher closes its record in every path it lives through; one killed outright cannot, and its record
said `running` until `runs` read it as `lost`. Over several nodes that is the common way a run ends badly: a
node's launcher killed (by a scheduler, a person, the OOM killer) ends the whole run, and each node keeps its own
record (issue 59). So each launch starts a warden beside it: a small process in a session of its own, not
dying with the launcher, holding the read end of a pipe whose write end only the launcher holds. The launcher
tells it the process tree it supervises (`watch`) and, once the record is closed, `release`s it. The pipe's end
without a release means the launcher died: the warden waits for that tree to end (torchrun dies with its
launcher and stops its workers, `supervise.py`; bounded), then closes a record still `running` as `failed`,
saying so, with the run's last metrics. A record the launcher closed is never touched.

Run as `python -m dflash_doctor.launch.warden --record PATH --fd N` (the launcher's own interpreter).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from dflash_base.atomic import write_json_atomic
from dflash_doctor.launch.run_outputs import last_metrics
from dflash_doctor.launch.runs import DamagedRecord, RunRecord
from dflash_doctor.launch.supervise import STOP_GRACE_S

RELEASE = b"release\n"
TREE_GONE_S = STOP_GRACE_S + 10.0  # torchrun's own stop of its workers, then ours: how long the tree may take
POLL_S = 0.2


class Warden:
    """The launcher's end of its warden: `watch(pid)` once the run's process tree starts, `release()` once the
    record is closed (then the warden exits and touches nothing)."""

    def __init__(self, proc: subprocess.Popen[bytes], write_fd: int) -> None:
        self.proc, self.write_fd = proc, write_fd

    @classmethod
    def start(cls, record_path: Path) -> Warden | None:
        """Started beside the launcher; None when it cannot be (the launch goes on without one)."""
        read_fd, write_fd = os.pipe()  # both close-on-exec: only the warden is handed the read end
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "dflash_doctor.launch.warden", "--record", str(record_path),
                 "--fd", str(read_fd)],
                pass_fds=(read_fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a stop signal to the launcher's group is not the warden's
            )  # fmt: skip
        except OSError:
            os.close(write_fd)
            return None
        finally:
            os.close(read_fd)
        return cls(proc, write_fd)

    def watch(self, pid: int) -> None:
        """The root of the tree the launcher supervises (torchrun, or a lone rank)."""
        with contextlib.suppress(OSError):
            os.write(self.write_fd, f"pid {pid}\n".encode())

    def release(self) -> None:
        """The record is closed: the warden exits without touching it."""
        with contextlib.suppress(OSError):
            os.write(self.write_fd, RELEASE)
        with contextlib.suppress(OSError):
            os.close(self.write_fd)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet has ended: a container's PID 1 may never reap it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_for_launcher(fd: int) -> tuple[bool, int | None]:
    """Read the pipe to its end: (released, the watched tree's root)."""
    released, root, buffer = False, None, b""
    while chunk := os.read(fd, 4096):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line == RELEASE.strip():
                released = True
            elif line.startswith(b"pid "):
                root = int(line[4:])
    return released, root


def close_abandoned(path: Path, launcher_gone_at: float) -> bool:
    """A record still `running` after its launcher died: `failed`, saying why, with the last metrics. False
    when the launcher had closed it (or it is not a record): nothing is written then."""
    try:
        record = RunRecord.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, DamagedRecord):
        return False
    if record.status != "running":
        return False
    record.status = "failed"
    record.finished = time.time()
    record.reason = (
        f"the launcher (pid {record.launcher_pid} on {record.host or socket.gethostname()}) was killed before it "
        "could close this record (SIGKILL, the OOM killer, a scheduler); its torchrun and workers stopped with it"
    )
    record.notes.append(
        f"closed by the launcher's warden {time.time() - launcher_gone_at:.1f} s after the launcher died"
    )
    if record.output_dir:
        record.metrics = last_metrics(Path(record.output_dir), record.created) or record.metrics
    write_json_atomic(path, record.to_json())
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash_doctor.launch.warden")
    parser.add_argument("--record", required=True, type=Path)
    parser.add_argument("--fd", required=True, type=int)
    args = parser.parse_args(argv)
    released, root = wait_for_launcher(args.fd)
    if released:
        return 0
    gone_at = time.time()
    deadline = time.monotonic() + TREE_GONE_S
    while root is not None and alive(root) and time.monotonic() < deadline:
        time.sleep(POLL_S)  # the last metrics are the workers' own, written as they stop
    close_abandoned(args.record, gone_at)
    return 0


if __name__ == "__main__":
    sys.exit(main())
