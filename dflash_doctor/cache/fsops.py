"""File operations for folders other users may write (`/tmp/torchinductor_<user>` lives in one).

Nothing here follows a link or reuses a name someone else chose: files are opened with `O_NOFOLLOW`,
created with `O_EXCL` (or at a random name, then renamed), renamed with `RENAME_NOREPLACE` where the
target must not exist, and read back only when they are regular files owned by this user. A FIFO or a
device is never opened blocking (`O_NONBLOCK`, then checked): a planted FIFO cannot hang a reader.

The `*_at` functions act on a name in a folder already open (a handle, `parent_dir.py`): the kernel
settles what the name is at the moment of the call, in that folder, whatever a path to it means by then.
"""

from __future__ import annotations

import contextlib
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
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _renameat2(from_fd: int, a: str | Path, to_fd: int, b: str | Path, flags: int) -> bool:
    """renameat2(from_fd, a, to_fd, b, flags); False when this kernel or filesystem does not support the flags."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(from_fd, os.fsencode(a), to_fd, os.fsencode(b), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), str(b))


def exchange_at(folder: int, a: str, b: str) -> bool:
    """Atomically swap two names of the open folder `folder` (RENAME_EXCHANGE). False when unsupported."""
    return _renameat2(folder, a, folder, b, _RENAME_EXCHANGE)


def rename_noreplace_at(folder: int, source: str, dest: str) -> None:
    """Rename within the open folder `folder`, refusing (FileExistsError) when `dest` exists, whoever put
    it there. Where the kernel cannot say so atomically: a link for a file, a checked rename for a folder
    (a name planted between the check and the rename is replaced: only there, and only a name)."""
    if _renameat2(folder, source, folder, dest, _RENAME_NOREPLACE):
        return
    info = os.stat(source, dir_fd=folder, follow_symlinks=False)
    if not stat.S_ISDIR(info.st_mode):
        os.link(source, dest, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)  # EEXIST: atomic
        os.unlink(source, dir_fd=folder)
        return
    if lstat_at(folder, dest) is not None:
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dest)
    os.rename(source, dest, src_dir_fd=folder, dst_dir_fd=folder)


def rename_noreplace(source: Path, dest: Path) -> None:
    """Rename by path, refusing (FileExistsError) when `dest` exists (an archive into its store)."""
    if _renameat2(_AT_FDCWD, source, _AT_FDCWD, dest, _RENAME_NOREPLACE):
        return
    if not source.is_dir() or source.is_symlink():
        os.link(source, dest, follow_symlinks=False)  # EEXIST when dest exists: atomic too
        os.unlink(source)
        return
    if os.path.lexists(dest):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dest))
    os.rename(source, dest)


def lstat_at(folder: int, name: str) -> os.stat_result | None:
    """What `name` is in the open folder `folder`, links not followed; None when nothing is there."""
    try:
        return os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return None


_AT_SYMLINK_NOFOLLOW = 0x100
_AT_EMPTY_PATH = 0x1000
_STATX_MNT_ID = 0x1000
_STATX_ATTR_MOUNT_ROOT = 0x2000


def _statx(folder: int, name: str, flags: int) -> tuple[int, int, int] | None:
    """(attributes, attributes_mask, mount id or -1) of `name` in the open folder (statx(2)); None where
    the C library or the kernel has no statx."""
    try:
        call = ctypes.CDLL(None, use_errno=True).statx
    except (OSError, AttributeError):
        return None
    buffer = ctypes.create_string_buffer(256)
    call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_char_p]
    if call(folder, os.fsencode(name), flags | _AT_SYMLINK_NOFOLLOW, _STATX_MNT_ID, buffer) != 0:
        return None
    raw = buffer.raw
    mask = int.from_bytes(raw[0:4], "little")
    attributes, attributes_mask = int.from_bytes(raw[8:16], "little"), int.from_bytes(raw[56:64], "little")
    mount_id = int.from_bytes(raw[144:152], "little") if mask & _STATX_MNT_ID else -1
    return attributes, attributes_mask, mount_id


def is_mount_point_at(folder: int, name: str) -> bool:
    """Whether `name` in the open folder is a mount point of any kind, a bind mount of a folder of the same
    filesystem included (same device, so st_dev cannot tell; issue 37, B1): statx's mount-root attribute or
    mount id against the folder's, else another device than the folder's."""
    inner, outer = _statx(folder, name, 0), _statx(folder, "", _AT_EMPTY_PATH)
    if inner is not None and inner[1] & _STATX_ATTR_MOUNT_ROOT:
        return bool(inner[0] & _STATX_ATTR_MOUNT_ROOT)
    if inner is not None and outer is not None and inner[2] >= 0 and outer[2] >= 0:
        return inner[2] != outer[2]
    info = lstat_at(folder, name)
    return info is not None and info.st_dev != os.fstat(folder).st_dev


def read_only(where: int | str | os.PathLike[str]) -> bool:
    """The folder (a handle or a path) is on a file system mounted read-only (a shared read-only store, a
    cache on a read-only bind mount): nothing can be created there, not even a lock (issue 37, B6/B7)."""
    try:
        return bool(os.statvfs(where).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def identity(info: os.stat_result) -> tuple[int, int]:
    """(device, inode): what a folder is, whatever it is called now (a rename keeps both)."""
    return info.st_dev, info.st_ino


def open_folder_at(folder: int, name: str) -> int:
    """The folder `name` of the open folder `folder` as a handle; a link there is refused (ELOOP), never
    followed, and anything but a folder is NotADirectoryError."""
    return os.open(name, _FOLDER_FLAGS, dir_fd=folder)


def read_owned_at(folder: int, name: str, max_bytes: int = 1 << 20) -> bytes | None:
    """`read_owned` for a name in an open folder."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=folder)
    except OSError:
        return None
    return _read_owned_fd(fd, max_bytes)


def write_atomic_at(folder: int, name: str, data: bytes, mode: int = 0o600) -> None:
    """Write `name` in the open folder `folder`: a new file at a random name (O_EXCL, O_NOFOLLOW), fsync,
    renamed over `name` (a link there is replaced, never followed), the folder fsynced."""
    temp = f"{random_name(name)}.tmp"
    try:
        fd = os.open(temp, _CREATE_FLAGS, mode, dir_fd=folder)
    except OSError as exc:  # named by the file it was to be, not by a temp name (issue 58, P1)
        raise OSError(exc.errno, exc.strerror, name) from None
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(temp, dir_fd=folder)
        raise
    os.close(fd)
    try:
        os.rename(temp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        os.unlink(temp, dir_fd=folder)
        raise
    with contextlib.suppress(OSError):
        os.fsync(folder)


def remove_tree_at(folder: int, name: str, last: str | None = None) -> None:
    """Delete the folder `name` of the open folder `folder` and everything in it, through handles (no
    link followed, no path looked up twice). `last`, a file at its top, goes after everything else: a
    kill midway leaves it, so what is left still says whose it is (a backup's ownership record)."""
    top = open_folder_at(folder, name)
    try:
        _empty_folder(top, keep=last)
        if last is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(last, dir_fd=top)
    finally:
        os.close(top)
    os.rmdir(name, dir_fd=folder)


def _empty_folder(folder: int, keep: str | None = None) -> None:
    with os.scandir(folder) as entries:
        names = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
    for entry_name, is_dir in names:
        if entry_name == keep:
            continue
        if not is_dir:
            os.unlink(entry_name, dir_fd=folder)
            continue
        inner = open_folder_at(folder, entry_name)
        try:
            _empty_folder(inner)
        finally:
            os.close(inner)
        os.rmdir(entry_name, dir_fd=folder)


def fd_path(fd: int) -> str | None:
    """A path that reaches the open folder `fd` itself, whatever happens to the names above it
    (`/proc/self/fd/<fd>`: the kernel resolves it to the handle's folder); None without /proc."""
    path = f"/proc/self/fd/{fd}"
    try:
        return path if os.path.samestat(os.stat(path), os.fstat(fd)) else None
    except OSError:
        return None


def random_name(stem: str) -> str:
    """A hidden name nobody can guess in advance: `.<stem>.<64 random bits>`."""
    return f".{stem}.{secrets.token_hex(8)}"


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
    return _read_owned_fd(fd, max_bytes)


def _read_owned_fd(fd: int, max_bytes: int) -> bytes | None:
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
