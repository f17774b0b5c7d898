"""Write files so that a crash leaves the old content or the new, never a torn file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write to a temp file beside the target, fsync, rename over it, fsync the folder.

    An OSError names the target, not the temp file beside it (`/proc/.version.x1y2.tmp` means nothing).
    """
    target = Path(path)
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
