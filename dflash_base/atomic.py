"""Write files so that a crash leaves the old content or the new, never a torn file."""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write to a temp file beside the target, fsync, rename over it, fsync the folder.

    An OSError names the target, not the temp file beside it (`/proc/.version.x1y2.tmp` means nothing). Only a
    regular file (or nothing) is replaced: a device, a FIFO, a folder or a symbolic link at the target is an
    OSError saying what is there (issue 58, N3: `probe --out /dev/full` as root replaced the system's
    /dev/full with a JSON file).
    """
    target = Path(path)
    refuse_special(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write here ({exc.strerror})", str(target)) from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(exc.errno, f"cannot write it ({exc.strerror})", str(target)) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)
    return target


def refuse_special(target: Path) -> None:
    """An OSError (EEXIST) when something other than a regular file is at `target`: a rename would replace it."""
    try:
        info = os.lstat(target)
    except OSError:
        return
    if stat.S_ISREG(info.st_mode):
        return
    kinds = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))  # fmt: skip
    kind = next((name for test, name in kinds if test(info.st_mode)), "a special file")
    raise OSError(
        errno.EEXIST,
        f"{kind} is there, not a regular file: it is never replaced; give a file path",
        str(target),
    )


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    return write_bytes_atomic(path, text.encode())


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Make a rename durable: fsync the folder that holds it (best effort where unsupported)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a file written by another writer (torch.save, safetensors) to the disk before it is renamed."""
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())
