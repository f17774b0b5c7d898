"""An output folder belongs to one run at a time.

Two launches writing one `output.dir` interleave their metrics, overwrite one `summary.json` and mix
their checkpoints (issue 18, row 4). The launcher holds an OS file lock on `<output.dir>/.dflash-run.lock`
for the whole run (released by the kernel if the launcher dies, so a crash never leaves it stuck) and
writes who holds it beside it, so the second launch is refused with the first one's run id.

The lock is per node rank: the launchers of one multi-node run (`train --nnodes N --node-rank R`) on a
shared filesystem write one folder together, each holding its own node's lock (node 0, and a single-node
run, hold `.dflash-run.lock`; node R `.dflash-run.node<R>.lock`). Two launches of the same node rank on one
folder still refuse each other.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from dflash_base.atomic import write_json_atomic
from dflash_base.errors import DoctorError


def node_file(suffix: str, node_rank: int = 0) -> str:
    """`.dflash-run.<suffix>` for node 0 (and a single-node run), `.dflash-run.node<R>.<suffix>` for node R."""
    return f".dflash-run{f'.node{node_rank}' if node_rank else ''}.{suffix}"


class OutputLock:
    """Held while a run uses its output folder; `release()` (or the end of the process) frees it."""

    def __init__(self, folder: Path, node_rank: int = 0) -> None:
        self.folder = folder
        self.node_rank = node_rank
        self.owner_path = folder / node_file("owner.json", node_rank)
        self._lock_name = node_file("lock", node_rank)
        self._lock = FileLock(str(folder / self._lock_name), timeout=0)
        self.created = False  # `acquire` made the folder (a lone rank's early lock: `abandon` removes it)

    def acquire(self, run_id: str, pid: int) -> None:
        """Take the folder or raise DoctorError naming the run that has it."""
        try:
            self.created = not self.folder.exists()
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DoctorError(
                f"output.dir {self.folder}: cannot create it ({exc.strerror})",
                hint="choose another output.dir (--set output.dir=...)",
            ) from exc
        try:
            self._lock.acquire()
        except Timeout:
            node = f" for node rank {self.node_rank}" if self.node_rank else ""
            raise DoctorError(
                f"output.dir {self.folder} is in use{node} by {describe_owner(read_owner(self.owner_path))}",
                hint="wait for that run, stop it, or give this one another folder: --set output.dir=... "
                "(the nodes of one multi-node run share a folder only with distinct --node-rank)",
            ) from None
        owner = {
            "run": run_id,
            "pid": pid,
            "host": socket.gethostname(),  # on a shared filesystem the pid means something only there
            "node_rank": self.node_rank,
            "since": time.time(),
        }
        write_json_atomic(self.owner_path, owner)

    def release(self) -> None:
        """Free the folder; a no-op unless this lock holds it (the owner's note is then another run's)."""
        if not self._lock.is_locked:
            return
        with contextlib.suppress(OSError):
            self.owner_path.unlink(missing_ok=True)
        self._lock.release()

    def abandon(self) -> None:
        """Release for a launch that never ran (refused after a lone rank took the folder beside the gate):
        a folder this lock made, holding nothing but the lock, is removed, so a refusal leaves `output.dir`
        as it found it. The lock file goes while still held: a launch that opens it later makes a new one.
        A no-op unless this lock holds the folder."""
        if not self._lock.is_locked:
            return
        if self.created:
            with contextlib.suppress(OSError):
                if {p.name for p in self.folder.iterdir()} <= {self._lock_name, self.owner_path.name}:
                    Path(self._lock.lock_file).unlink(missing_ok=True)
        self.release()
        if self.created:
            with contextlib.suppress(OSError):
                self.folder.rmdir()  # only when empty


def read_owner(owner_path: Path) -> dict[str, Any]:
    """Who holds a lock, from its owner file ({} when it is missing or unreadable)."""
    try:
        data = json.loads(owner_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def describe_owner(owner: dict[str, Any]) -> str:
    run, pid, host = owner.get("run"), owner.get("pid"), owner.get("host")
    if not isinstance(run, str):
        return "another run"
    where = f" on {host}" if isinstance(host, str) else ""
    return f"run {run}" + (f" (launcher pid {pid}{where})" if isinstance(pid, int) else "")
