"""A full disk as one named error: which file, how many bytes it needed, how many were free.

A write that runs out of space fails in as many ways as there are writers: `OSError [Errno 28]` from
Python, `RuntimeError: basic_ios::clear: iostream error` or "unexpected pos" from `torch.save`,
`SafetensorError ... os error 28` from safetensors. `writing(path, needed)` turns any of them into `NoSpace`
when the disk is what failed (the error says so, or the file system has fewer free bytes than the write
needs), so every writer reports a full disk the same way: one line a person can act on.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dflash_base.errors import DoctorError

# The errors that mean "this file system cannot take more": no space, a quota, a file over the size limit.
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class NoSpace(DoctorError):
    """A write that the file system had no room for (exit 2: free space, or write elsewhere)."""

    def __init__(self, path: str | os.PathLike[str], needed: int | None, free: int | None) -> None:
        self.path, self.needed, self.free = str(path), needed, free
        need = f"needs {size_text(needed)}" if needed is not None else "needs more space"
        have = f", {size_text(free)} free there" if free is not None else ""
        super().__init__(
            f"no space left on the device for {self.path}: it {need}{have}",
            hint="free space on that file system, or write somewhere with room (output.dir, --out)",
        )


def size_text(count: int | None) -> str:
    """`12.4 GB`, `2.6 MB`, `840 bytes`: decimal units, as `df -H` shows them."""
    if count is None:
        return "?"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(count) >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} bytes"


def existing_ancestor(path: str | os.PathLike[str]) -> Path:
    """`path` itself or the nearest folder above it that exists: where a file to be made will live."""
    current = Path(os.path.abspath(path))
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Bytes an unprivileged writer may still use on the file system that holds (or will hold) `path`."""
    try:
        return shutil.disk_usage(existing_ancestor(path)).free
    except OSError:
        return None


def is_full_error(exc: BaseException) -> bool:
    """An OSError (or a library's wrapper of one) that says the file system is full."""
    if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
        return True
    text = str(exc)
    return "os error 28" in text or "No space left on device" in text


def require_space(path: str | os.PathLike[str], needed: int) -> None:
    """NoSpace before writing anything, when the file system already lacks `needed` free bytes."""
    free = free_bytes(path)
    if free is not None and free < needed:
        raise NoSpace(path, needed, free)


@contextmanager
def writing(
    path: str | os.PathLike[str], needed: int | None = None, cleanup: Callable[[], None] | None = None
) -> Iterator[None]:
    """Around the write of `path` (`needed`: the bytes it takes, when known). On any failure `cleanup`
    runs first (it removes what was written partly: the caller knows its temporary names), then a failure
    caused by a full file system comes out as NoSpace naming `path`, with the bytes free once the partial
    files are gone; any other failure goes through unchanged."""
    try:
        yield
    except BaseException as exc:
        if cleanup is not None:
            cleanup()
        if isinstance(exc, NoSpace) or not isinstance(exc, Exception):
            raise
        if (
            isinstance(exc, OSError) and exc.errno == errno.EROFS
        ):  # never "full": it takes no byte at all (N10)
            raise DoctorError(
                f"{path} is on a read-only file system: nothing can be written there",
                hint="give a folder on a writable disk (output.dir, --out)",
            ) from exc
        free = free_bytes(path)
        if is_full_error(exc) or (needed is not None and free is not None and free < needed):
            raise NoSpace(path, needed, free) from exc
        raise
