"""File operations for folders other users may write (`/tmp/torchinductor_<user>` lives in one).

Nothing here follows a link or reuses a name someone else chose: files are opened with `O_NOFOLLOW`,
created with `O_EXCL` (or at a random name, then renamed), renamed with `RENAME_NOREPLACE` where the
target must not exist, and read back only when they are regular files owned by this user. A FIFO or a
device is never opened blocking (`O_NONBLOCK`, then checked): a planted FIFO cannot hang a reader.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import stat
from pathlib import Path
from typing import BinaryIO

from dflash_base.errors import DoctorError

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_UNSUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _renameat2(a: Path, b: Path, flags: int) -> bool:
    """renameat2(a, b, flags); False when this kernel or filesystem does not support the flags."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), str(b))


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (RENAME_EXCHANGE). False when unsupported here."""
    return _renameat2(a, b, _RENAME_EXCHANGE)


def rename_noreplace(source: Path, dest: Path) -> None:
    """Rename, refusing (FileExistsError) when `dest` exists, whoever put it there. Where the kernel
    cannot say so atomically: a link for a file, a checked rename for a folder."""
    if _renameat2(source, dest, _RENAME_NOREPLACE):
        return
    if not source.is_dir() or source.is_symlink():
        os.link(source, dest, follow_symlinks=False)  # EEXIST when dest exists: atomic too
        os.unlink(source)
        return
    if os.path.lexists(dest):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dest))
    os.rename(source, dest)


def random_name(stem: str) -> str:
    """A hidden name nobody can guess in advance: `.<stem>.<64 random bits>`."""
    return f".{stem}.{secrets.token_hex(8)}"


def create_exclusive(path: Path, mode: int = 0o600) -> int:
    """A new file, never an existing one or a link's target; `mode` exactly, whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    os.fchmod(fd, mode)
    return fd


def open_regular(path: Path, what: str = "file") -> BinaryIO:
    """Open a regular file for reading: a link, a FIFO, a device or a folder is a DoctorError, never
    followed or waited on."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DoctorError(f"{path}: a symbolic link where a {what} belongs; it is not followed") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise DoctorError(f"{path}: not a regular file (a {kind_of(info.st_mode)}); a {what} must be one")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_owned(path: Path, max_bytes: int = 1 << 20) -> bytes | None:
    """The bytes of a small regular file owned by this user; None when absent, a link, another user's,
    something else than a regular file, or larger than `max_bytes`."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_size > max_bytes:
            return None
        os.set_blocking(fd, True)
        return os.read(fd, max_bytes + 1)[:max_bytes]
    except OSError:
        return None
    finally:
        os.close(fd)


def owned_folder(path: Path) -> bool:
    """A real folder (not a link) owned by this user."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()


def kind_of(mode: int) -> str:
    """`folder`, `symbolic link`, `FIFO`, ... for messages."""
    for test, name in (
        (stat.S_ISDIR, "folder"),
        (stat.S_ISLNK, "symbolic link"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISREG, "regular file"),
    ):
        if test(mode):
            return name
    return "special file"


def printable(text: str, limit: int = 200) -> str:
    """`text` safe for a terminal: control characters (escape sequences) shown as \\xNN, cut at `limit`."""
    safe = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return safe if len(safe) <= limit else safe[: limit - 1] + "…"
