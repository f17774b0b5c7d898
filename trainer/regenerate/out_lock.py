"""One `data regenerate` at a time per output file.

Two runs into one `--out` both resumed from the same ids and appended every answer twice (issue 58, N5: 63
of 64 ids doubled after 4 minutes). So a run holds an OS file lock beside its output for its whole length,
`.<out>.dflash-regenerate.lock` (released by the kernel if the process dies: a crash never leaves it stuck),
and writes who holds it beside it, as `train` locks its output folder (`dflash_doctor/launch/output_lock.py`):
a second run is refused, naming the first one's pid and host.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dflash_base.atomic import write_json_atomic
from dflash_base.errors import DoctorError


def lock_paths(out: Path) -> tuple[Path, Path]:
    """(the lock file, its holder's note) of the output `out`: hidden, beside it."""
    return out.with_name(f".{out.name}.dflash-regenerate.lock"), out.with_name(
        f".{out.name}.dflash-regenerate.owner.json"
    )


@contextmanager
def holding_output(out: Path) -> Iterator[None]:
    """Hold `out` for this run; a DoctorError naming the run that holds it already."""
    from filelock import FileLock, Timeout

    lock_file, owner_file = lock_paths(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DoctorError(
            f"--out {out}: cannot make its folder ({exc.strerror})", hint="give another --out"
        ) from None
    try:  # a folder where no file can be made (/proc, a read-only mount): nothing can append to --out there
        os.close(os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
    except OSError:  # either: the job's own checks say what is wrong with --out
        yield
        return
    lock = FileLock(str(lock_file), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise DoctorError(
            f"--out {out} is being written by another data regenerate ({describe(read_owner(owner_file))}): two "
            "runs into one file would write every answer twice",
            hint="wait for it (or stop it), then run this again to resume; or give this one another --out",
        ) from None
    except OSError as exc:
        raise DoctorError(
            f"--out {out}: cannot lock it ({exc.strerror})", hint="give another --out"
        ) from None
    try:
        with contextlib.suppress(OSError):  # the note only names the holder; the lock is what excludes
            write_json_atomic(
                owner_file, {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
            )
        yield
    finally:
        with contextlib.suppress(OSError):
            owner_file.unlink(missing_ok=True)
        lock.release()


def read_owner(owner_file: Path) -> dict[str, Any]:
    try:
        data = json.loads(owner_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def describe(owner: dict[str, Any]) -> str:
    pid, host, since = owner.get("pid"), owner.get("host"), owner.get("since")
    if not isinstance(pid, int):
        return "its holder did not say who it is"
    where = f" on {host}" if isinstance(host, str) else ""
    when = (
        f", since {time.strftime('%H:%M:%S', time.localtime(since))}"
        if isinstance(since, int | float)
        else ""
    )
    return f"pid {pid}{where}{when}"
