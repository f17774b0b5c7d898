"""One lock per cache folder, beside it, taken by every command that reads or replaces that folder.

The store's lock belongs to one home; two homes (two `DFLASH_DOCTOR_HOME`s, two users of one
`TORCHINDUCTOR_CACHE_DIR`) would each hold their own and restore into one cache at once. So the lock
lives beside the folder it guards, `<parent>/.<name>.dflash-doctor.lock`, named by the folder's real
path (two spellings of one folder share it), and is a POSIX `flock`.

The parent may be writable by others (`/tmp`): the lock file is opened with `O_NOFOLLOW` and never
truncated (filelock opens with `O_TRUNC`, which a planted link would turn on any file), and it must be
a regular file owned by this user, or the command stops with a message naming it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from dflash_base.errors import DoctorError
from dflash_doctor.cache.fsops import kind_of

LOCK_SUFFIX = ".dflash-doctor.lock"
TIMEOUT_S = 600.0
_POLL_S = 0.05


def lock_path(folder: Path) -> Path:
    """Where the lock of `folder` lives: beside it, named after its real path's last part."""
    real = Path(os.path.realpath(folder.parent)) / folder.name
    return real.parent / f".{real.name}{LOCK_SUFFIX}"


def _open_lock(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            why = "is a symbolic link"
        elif exc.errno == errno.EISDIR:
            why = "is a folder"
        else:
            why = f"cannot be opened ({exc.strerror})"
        raise DoctorError(
            f"the cache lock {path} {why}",
            hint=f"remove {path} if you did not make it, then try again",
        ) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        os.close(fd)
        what = kind_of(info.st_mode) if not stat.S_ISREG(info.st_mode) else f"file of uid {info.st_uid}"
        raise DoctorError(
            f"the cache lock {path} is a {what}, not a file of yours: someone else may be using this cache",
            hint="point TORCHINDUCTOR_CACHE_DIR at a folder only you can write (see `dflash-doctor cache status`)",
        )
    return fd


@contextmanager
def folder_lock(folder: Path, timeout: float = TIMEOUT_S) -> Iterator[None]:
    """Hold the lock of one cache folder (its parent is made when missing)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    path = lock_path(folder)
    fd = _open_lock(path)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise DoctorError(
                        f"another dflash-doctor command is using the cache {folder} (lock {path})",
                        hint="wait for it to finish, then try again",
                    ) from None
                time.sleep(_POLL_S)
        yield
    finally:
        os.close(fd)  # releases the flock


@contextmanager
def folder_locks(folders: Iterable[Path], timeout: float = TIMEOUT_S) -> Iterator[None]:
    """Hold the locks of several cache folders, always taken in one order (no deadlock)."""
    by_lock = {str(lock_path(folder)): folder for folder in folders}  # two spellings, one lock
    with ExitStack() as stack:
        for key in sorted(by_lock):
            stack.enter_context(folder_lock(by_lock[key], timeout))
        yield
