"""The locks of the cache store: one beside each cache folder, one for the snapshot store, one for the
warm-up records; all opened one way.

The store's lock belongs to one home; two homes (two `DFLASH_DOCTOR_HOME`s, two users of one
`TORCHINDUCTOR_CACHE_DIR`) would each hold their own and restore into one cache at once. So a cache
folder's lock lives beside it, `<parent>/.<name>.dflash-doctor.lock`, named by the folder's real path
(two spellings of one folder share it), a POSIX `flock`, opened through the parent's handle after the
parent was judged (parent_dir.py): `folder_lock` hands that handle to the command.

Every lock file is opened with `O_NOFOLLOW`, created when missing and never truncated (filelock 3.x
opened with `O_TRUNC` and followed links: a link planted there truncated and chmod-ed any file), then
checked on the handle: a regular file of this user with one link (a hard link to another file is
refused). Anything else stops the command with a message naming it.

Beside the cache is not enough: in a shared parent (sticky, as /tmp) another user can create the lock's
name first (issue 30, N5), and a lock in each home let two homes restore into one cache at once, one's
recovery deleting the other's staging folder mid-extraction (issue 37, G3). So every cache folder's lock
is taken first in this user's lock folder (`paths.lock_root()`: the same for every home, made 0700, every
folder above it judged as a cache's parent is), named by the identity of the cache folder's place: the
device and inode of its parent and its name (two spellings of one folder, or a bind mount of its parent,
share it). The lock beside the cache is then taken too while it is ours (older versions wait on it); one
that is another user's is left alone, and so is one that cannot be created because the parent is on a
read-only file system (a prebuilt cache on a read-only mount: a snapshot reads it; issue 37, B6).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from dflash_base.errors import DoctorError
from dflash_doctor import paths
from dflash_doctor.cache import fsops
from dflash_doctor.cache.fsops import kind_of
from dflash_doctor.cache.parent_dir import ParentDir, lock_folder_remedy, open_trusted

LOCK_SUFFIX = ".dflash-doctor.lock"
TIMEOUT_S = 600.0
_POLL_S = 0.05
_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class LockRefused(DoctorError):
    """A lock's name is taken by something that is not a lock file of ours."""


def lock_path(folder: Path) -> Path:
    """Where the lock of `folder` lives: beside it, named after its real path's last part."""
    real = Path(os.path.realpath(folder.parent)) / folder.name
    return real.parent / f".{real.name}{LOCK_SUFFIX}"


def identity_lock_name(parent: ParentDir, name: str) -> str:
    """The name of a cache folder's lock in the lock folder: its parent's device and inode, and its name."""
    info = os.fstat(parent.fd)
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:32]
    return f"{info.st_dev:x}-{info.st_ino:x}-{digest}.lock"


@contextmanager
def identity_lock(parent: ParentDir, name: str, timeout: float, busy: DoctorError) -> Iterator[int]:
    """Hold the lock of the cache folder `name` in `parent` in this user's lock folder."""
    root = paths.lock_root()
    paths.make_private_dirs(root)
    folder = open_trusted(root, "the lock folder", lock_folder_remedy)
    try:
        lock_name = identity_lock_name(parent, name)
        fd = open_lock(
            lock_name, "the cache lock", root / lock_name, f"remove {root / lock_name}", dir_fd=folder
        )
    finally:
        os.close(folder)
    try:
        hold(fd, timeout, busy)
        yield fd
    finally:
        os.close(fd)  # releases the flock


def open_lock(name: str | Path, what: str, where: Path, hint: str, dir_fd: int | None = None) -> int:
    """Open (or create) a lock file, checked after the open: `where` names it in messages."""
    try:
        fd = os.open(name, _OPEN_FLAGS, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            refused = "is a symbolic link"
        elif exc.errno == errno.EISDIR:
            refused = "is a folder"
        else:
            refused = f"cannot be opened ({exc.strerror})"
        raise LockRefused(f"{what} {where} {refused}", hint=hint) from None
    info = os.fstat(fd)
    why: str | None = None
    if not stat.S_ISREG(info.st_mode):
        why = f"is a {kind_of(info.st_mode)}, not a file"
    elif info.st_uid != os.getuid():
        why = f"is a file of uid {info.st_uid}, not a file of yours: someone else may be using it"
    elif info.st_nlink != 1:
        why = f"has {info.st_nlink} names: a hard link to another file, not a lock of its own"
    if why is not None:
        os.close(fd)
        raise LockRefused(f"{what} {where} {why}", hint=hint)
    return fd


def hold(fd: int, timeout: float, busy: DoctorError) -> None:
    """Take the flock of `fd`, waiting up to `timeout` seconds; `busy` is raised after that."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise busy from None
            time.sleep(_POLL_S)


@contextmanager
def lock_file(path: Path, what: str, timeout: float, busy: DoctorError, hint: str) -> Iterator[None]:
    """Hold the lock file `path` (its folder must exist) until the block ends."""
    fd = open_lock(path, what, path, hint)
    try:
        hold(fd, timeout, busy)
        yield
    finally:
        os.close(fd)  # releases the flock


@contextmanager
def folder_lock(folder: Path, timeout: float = TIMEOUT_S) -> Iterator[ParentDir]:
    """Hold the lock of one cache folder; yields the handle of its parent (made when missing), judged."""
    where = lock_path(folder)
    busy = DoctorError(
        f"another dflash-doctor command is using the cache {folder} (lock {where})",
        hint="wait for it to finish, then try again",
    )
    hint = f"remove {where} if you did not make it, then try again"
    with ParentDir.open(folder.parent) as parent, ExitStack() as stack:
        name = f".{folder.name}{LOCK_SUFFIX}"
        parent.lock_fds.append(stack.enter_context(identity_lock(parent, folder.name, timeout, busy)))
        beside: int | None
        if fsops.read_only(parent.fd):  # no one changes the folder through this mount: no lock needed to read
            beside = None
        elif parent.shared:  # others can take the name beside the cache
            try:
                beside = open_lock(name, "the cache lock", where, hint, dir_fd=parent.fd)
            except LockRefused:
                beside = None  # another user's name: left alone
        else:
            beside = open_lock(
                name,
                "the cache lock",
                where,
                "point TORCHINDUCTOR_CACHE_DIR at a folder only you can write "
                f"(see `dflash-doctor cache status`), or remove {where} if you did not make it",
                dir_fd=parent.fd,
            )
        if beside is not None:
            stack.callback(os.close, beside)  # releases the flock
            hold(beside, timeout, busy)
            parent.lock_fds.append(beside)
        yield parent


def held_lock_fds(parents: dict[Path, ParentDir]) -> tuple[int, ...]:
    """The descriptors of the locks held for these folders: a child given them (`pass_fds`) holds the locks as
    long as it lives, after its parent too (issue 58, W2: a `cache warm` killed outright left its compile child
    writing into a cache no lock held, while a restore swapped it and said "verified")."""
    return tuple(sorted({fd for parent in parents.values() for fd in parent.lock_fds}))


@contextmanager
def folder_locks(folders: Iterable[Path], timeout: float = TIMEOUT_S) -> Iterator[dict[Path, ParentDir]]:
    """Hold the locks of several cache folders, always taken in one order (no deadlock); yields each
    folder's parent handle."""
    folders = list(folders)
    by_lock = {str(lock_path(folder)): folder for folder in folders}  # two spellings, one lock
    with ExitStack() as stack:
        parents = {key: stack.enter_context(folder_lock(by_lock[key], timeout)) for key in sorted(by_lock)}
        yield {folder: parents[str(lock_path(folder))] for folder in folders}
