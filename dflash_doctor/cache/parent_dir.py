"""The folder that holds a cache, opened once as a handle, judged on that handle, and used through it.

A restore renames the cache, makes staging folders beside it and writes records into what it moved; a
snapshot writes our marker into the cache. Done by path, each step looks the path up again, so another
user who can change what a name there means (a link planted at an absent cache's name in /tmp, or a
parent folder that is theirs) redirects a root restore's writes into a folder of their choosing
(issue 30, N1 and N1b). So the parent is opened once, without following any link (each part of its real
path opened with `O_NOFOLLOW` from the one before), its owner and mode are judged on that handle, and
every rename, mkdir, record write and deletion beside the cache is relative to it (fsops' `*_at`).

The rule for the parent is `check`'s `cache.parent_writable`: owned by this user or root, and not
writable by others unless sticky (as /tmp, 1777), where others may add names but not rename or remove
ours. A parent that breaks it is refused with the fix: no restore, snapshot or warm-up uses that cache.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import stat
from collections.abc import Callable
from pathlib import Path

from dflash_base.errors import DoctorError
from dflash_doctor import paths
from dflash_doctor.cache import fsops
from dflash_doctor.cache.locations import INDUCTOR_VARIABLE, managed_inductor_dir

_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def exposure(uid: int, mode: int) -> str | None:
    """Who may change names in a folder of this owner and mode: `open` when others may rename or replace
    what is in it (group/world-writable without the sticky bit, or another user's), `shared` when they
    may only add names beside ours (sticky, as /tmp), None when only its owner (us or root) can."""
    if uid not in (0, os.getuid()):
        return "open"
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "shared" if mode & stat.S_ISVTX else "open"
    return None


def parent_remedy() -> str:
    return f"export {INDUCTOR_VARIABLE}={managed_inductor_dir()}  # a cache in a folder only you own"


def lock_folder_remedy(folder: Path) -> str:
    """The fix when a folder on the way to this user's lock folder is one others can write (issue 58, L2: a
    group-writable ~/.cache under umask 002 refused every restore with the cache's hint, which fixed nothing)."""
    return (
        f"chmod go-w {shlex.quote(str(folder))}  # or: export {paths.LOCK_DIR_ENV}=<a folder only you can write, "
        "the same for every DFLASH_DOCTOR_HOME>"
    )


class ParentDir:
    """An open handle of the folder that holds a cache; close it (or use `with`)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd
        self.lock_fds: list[int] = []  # the cache folder's locks held through it (folder_lock.py)
        info = os.fstat(fd)
        self.shared = exposure(info.st_uid, stat.S_IMODE(info.st_mode)) == "shared"

    @classmethod
    def open(cls, path: Path, make: bool = True) -> ParentDir:
        """Open `path` (made, 0755, when missing and `make`) and judge it: a DoctorError when others
        could rename the cache away or put a link in its place."""
        if make:
            paths.make_private_dirs(path)
        return cls(path, open_trusted(path, "the cache's folder"))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> ParentDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- names in the folder, each looked up by the kernel in this folder at the moment of the call

    def lstat(self, name: str) -> os.stat_result | None:
        return fsops.lstat_at(self.fd, name)

    def identity(self, name: str) -> tuple[int, int] | None:
        """(device, inode) of the folder at `name`; None when nothing, or not a folder, is there."""
        info = self.lstat(name)
        return fsops.identity(info) if info is not None and stat.S_ISDIR(info.st_mode) else None

    def names(self) -> list[str]:
        return sorted(os.listdir(self.fd))

    def mkdir(self, name: str, mode: int = 0o700) -> None:
        """A new folder (FileExistsError when the name is taken, whatever took it), exactly `mode`."""
        os.mkdir(name, mode, dir_fd=self.fd)
        made = self.open_folder(name)
        try:
            os.fchmod(made, mode)  # mkdir's mode is cut by the umask
        finally:
            os.close(made)

    def open_folder(self, name: str) -> int:
        return fsops.open_folder_at(self.fd, name)

    def exchange(self, a: str, b: str) -> bool:
        return fsops.exchange_at(self.fd, a, b)

    def rename_noreplace(self, source: str, dest: str) -> None:
        fsops.rename_noreplace_at(self.fd, source, dest)

    def read_owned(self, name: str, max_bytes: int = 1 << 20) -> bytes | None:
        return fsops.read_owned_at(self.fd, name, max_bytes)

    def read_in_owned_folder(self, folder: str, name: str) -> bytes | None:
        """File `name` at the top of our folder `folder` (opened without following links; None when either is
        missing or not ours): the marker or ownership record of a cache, staging folder or backup."""
        try:
            fd = self.open_folder(folder)
        except OSError:
            return None
        try:
            return fsops.read_owned_at(fd, name) if os.fstat(fd).st_uid == os.getuid() else None
        finally:
            os.close(fd)

    def write_atomic(self, name: str, data: bytes) -> None:
        try:
            fsops.write_atomic_at(self.fd, name, data)
        except OSError as exc:  # named by its path, not by the temp file's name or none
            raise OSError(exc.errno, exc.strerror, str(self.path / name)) from None

    def unlink(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)

    def remove_tree(self, name: str, last: str | None = None) -> None:
        fsops.remove_tree_at(self.fd, name, last)

    def free_bytes(self) -> int:
        info = os.fstatvfs(self.fd)
        return info.f_bavail * info.f_frsize

    def owned_folder(self, name: str) -> bool:
        info = self.lstat(name)
        return info is not None and stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()


def refusal(uid: int, mode: int) -> str | None:
    """Why a folder of this owner and mode may not hold (or be above) a cache; None when it may."""
    if uid not in (0, os.getuid()):
        return f"belongs to uid {uid}"
    if exposure(uid, mode) == "open":
        return f"is a folder others can write (mode {mode:04o}) without the sticky bit"
    return None


_MAX_LINKS = 40  # as the kernel's own limit on links followed in one lookup (ELOOP)


class _Untrusted(Exception):
    """A folder (or link) on the way that another user could change: where, why, and whether it is the last."""

    def __init__(self, where: Path, why: str, last: bool) -> None:
        super().__init__(where, why)
        self.where, self.why, self.last = where, why, last


def _link_refusal(info: os.stat_result, holder: int) -> str | None:
    """Why a link met on the way cannot be trusted: one of another user's in a folder anyone may add names to
    (sticky, as /tmp) can be pointed elsewhere by its owner at any moment."""
    if info.st_uid in (0, os.getuid()):
        return None
    if exposure(os.fstat(holder).st_uid, stat.S_IMODE(os.fstat(holder).st_mode)) == "shared":
        return f"is a symbolic link of uid {info.st_uid}: its owner can point it elsewhere"
    return None


def _walk(path: Path, stop_at_missing: bool) -> tuple[int, Path] | None:
    """A handle of the folder `path`, walked as given from `/`: each name opened with `O_NOFOLLOW` from the
    folder before it, a link met on the way read (never followed by the kernel) and its target walked the same
    way, and every folder judged on its handle, the folders holding a link included (issue 58, A1: the real
    path alone skipped the folder of another user that held the link). Raises `_Untrusted` for the first that
    breaks the rule; with `stop_at_missing`, None when a part is missing (OSError otherwise)."""
    names = [n for n in reversed(os.path.abspath(path).split("/")) if n]
    chain: list[tuple[int, Path]] = [(os.open("/", _FOLDER_FLAGS), Path("/"))]
    links = 0
    try:
        _judge(chain[0][0], chain[0][1], last=not names)
        while names:
            name = names.pop()
            if name == ".":
                continue
            if name == "..":
                if len(chain) > 1:
                    os.close(chain.pop()[0])
                continue
            holder, where = chain[-1]
            try:
                inner = os.open(name, _FOLDER_FLAGS, dir_fd=holder)
            except OSError as exc:
                info = (
                    fsops.lstat_at(holder, name)
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT)
                    else None
                )
                if info is None and exc.errno == errno.ENOENT and stop_at_missing:
                    return None
                if info is None or not stat.S_ISLNK(info.st_mode):
                    raise
                links += 1
                why = _link_refusal(info, holder)
                if why is not None:
                    raise _Untrusted(where / name, why, last=False) from None
                if links > _MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path)) from None
                target = os.readlink(name, dir_fd=holder)
                if target.startswith("/"):
                    while len(chain) > 1:
                        os.close(chain.pop()[0])
                names.extend(n for n in reversed(target.split("/")) if n)
                continue
            chain.append((inner, where / name))
            _judge(inner, where / name, last=not names)
        fd, where = chain.pop()
        return fd, where
    finally:
        for fd, _ in chain:
            os.close(fd)


def _judge(fd: int, where: Path, last: bool) -> None:
    info = os.fstat(fd)
    why = refusal(info.st_uid, stat.S_IMODE(info.st_mode))
    if why is not None:
        raise _Untrusted(where, why, last)


def untrusted_folder(path: Path) -> tuple[Path, str] | None:
    """The first folder from `/` down to `path`, walked as given (links read and their targets walked; a
    missing part ends the walk), that another user could change, and why: the rule of
    `cache.parent_writable` for every folder above a cache, not only its parent (issue 37, A1: whoever owns
    `/tmp/att` can swap `/tmp/att/p` for a link), the folder holding a link included (issue 58, A1)."""
    try:
        found = _walk(path, stop_at_missing=True)
    except _Untrusted as exc:
        return exc.where, exc.why
    except OSError:
        return None
    if found is not None:
        os.close(found[0])
    return None


def open_trusted(path: Path, what: str, remedy: Callable[[Path], str] | None = None) -> int:
    """A handle of the folder `path`, walked as given from `/` (`_walk`: no link followed by the kernel, every
    folder on the way judged on its handle, a folder holding a link too): owned by you or root, not writable by
    others unless sticky. A DoctorError naming the first folder that breaks the rule, before anything is
    written. `remedy(folder)`: the hint for that folder (default: a cache in a folder only you own)."""
    try:
        found = _walk(path, stop_at_missing=False)
    except _Untrusted as exc:
        where = what if exc.last else f"the folder above {what}"
        raise DoctorError(
            f"{where} {fsops.printable(str(exc.where), 4096)} {exc.why}: another user could rename what is in it "
            "or put a link in its place, and a restore, snapshot or warm-up would write through it as you",
            hint=remedy(exc.where) if remedy is not None else parent_remedy(),
        ) from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise DoctorError(
                f"{fsops.printable(str(path), 4096)} changed while it was being opened (a part of it became a link "
                "or a file)",
                hint="try again; if it happens again, another user may be changing it",
            ) from None
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    assert found is not None
    return found[0]
