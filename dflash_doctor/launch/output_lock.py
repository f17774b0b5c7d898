"""An output folder belongs to one run at a time.

Two launches writing one `output.dir` interleave their metrics, overwrite one `summary.json` and mix
their checkpoints (issue 18, row 4). The launcher holds an OS file lock on `<output.dir>/.dflash-run.lock`
for the whole run (released by the kernel if the launcher dies, so a crash never leaves it stuck) and
writes who holds it beside it, so the second launch is refused with the first one's run id.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from dflash_doctor.atomic import write_json_atomic
from dflash_doctor.errors import DoctorError

LOCK_NAME = ".dflash-run.lock"
OWNER_NAME = ".dflash-run.owner.json"


class OutputLock:
    """Held while a run uses its output folder; `release()` (or the end of the process) frees it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._lock = FileLock(str(folder / LOCK_NAME), timeout=0)

    def acquire(self, run_id: str, pid: int) -> None:
        """Take the folder or raise DoctorError naming the run that has it."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DoctorError(
                f"output.dir {self.folder}: cannot create it ({exc.strerror})",
                hint="choose another output.dir (--set output.dir=...)",
            ) from exc
        try:
            self._lock.acquire()
        except Timeout:
            raise DoctorError(
                f"output.dir {self.folder} is in use by {describe_owner(read_owner(self.folder))}",
                hint="wait for that run, stop it, or give this one another folder: --set output.dir=...",
            ) from None
        write_json_atomic(self.folder / OWNER_NAME, {"run": run_id, "pid": pid, "since": time.time()})

    def release(self) -> None:
        with contextlib.suppress(OSError):
            (self.folder / OWNER_NAME).unlink(missing_ok=True)
        self._lock.release()


def read_owner(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / OWNER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def describe_owner(owner: dict[str, Any]) -> str:
    run, pid = owner.get("run"), owner.get("pid")
    if not isinstance(run, str):
        return "another run"
    return f"run {run}" + (f" (launcher pid {pid})" if isinstance(pid, int) else "")
