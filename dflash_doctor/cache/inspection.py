"""What is in a cache folder: size, files, filesystem, owner and mode, and the build it was made for.

A compile cache holds code that gets loaded and executed (`.so`, `.py`, cubins), so who can write to
it matters as much as whether it survives a reboot. The build comes from our marker file (written at
snapshot, restore and warm); Inductor's own entries are pickles we must not load to find out.
"""

from __future__ import annotations

import functools
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_doctor.cache.fingerprint import BuildFingerprint
from dflash_doctor.cache.manifest import MARKER_NAME, read_marker
from dflash_doctor.cache.parent_dir import exposure, untrusted_folder
from dflash_doctor.env.forked import Started, start_job

VOLATILE_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs"})
SAMPLE = 5  # how many offending paths a report names


@dataclass(frozen=True)
class MountInfo:
    mount_point: str
    fs_type: str


def read_mounts(text: str | None = None) -> list[MountInfo]:
    """Mount points from /proc/self/mounts (or the given text), for finding a folder's filesystem."""
    if text is None:
        try:
            with open("/proc/self/mounts", encoding="utf-8") as handle:
                text = handle.read()
        except OSError:
            return []
    mounts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            mounts.append(MountInfo(parts[1].replace("\\040", " "), parts[2]))
    return mounts


def filesystem_of(path: Path, mounts: list[MountInfo]) -> str | None:
    """The filesystem type of the longest mount point containing `path`."""
    real = os.path.realpath(path)
    best: MountInfo | None = None
    for mount in mounts:
        point = mount.mount_point.rstrip("/") or "/"
        if (real == point or real.startswith(point + "/") or point == "/") and (
            best is None or len(point) > len(best.mount_point.rstrip("/") or "/")
        ):
            best = mount
    return best.fs_type if best else None


def volatility(path: Path, fs_type: str | None, tempdir: str | None = None) -> str | None:
    """Why a cache here would not survive (None when it would): tmpfs, or the shared temp folder."""
    if fs_type in VOLATILE_FILESYSTEMS:
        return f"on {fs_type} (emptied at reboot)"
    real = os.path.realpath(path)
    for shared in {os.path.realpath(tempdir or tempfile.gettempdir()), "/tmp", "/var/tmp"}:
        if real == shared or real.startswith(shared.rstrip("/") + "/"):
            return f"in the shared temp folder {shared} (cleaned by tmp cleaners and reboots)"
    return None


@dataclass
class FolderReport:
    """The facts `cache status` and the `cache.*` checks report for one folder."""

    label: str
    path: Path
    exists: bool
    size_bytes: int = 0
    files: int = 0
    fs_type: str | None = None
    volatile: str | None = None
    owner_uid: int | None = None
    mode: int | None = None
    unsafe_writable: list[str] = field(default_factory=list)  # group/world-writable entries
    foreign_owned: list[str] = field(default_factory=list)  # entries owned by another user
    unsafe_count: int = 0
    foreign_count: int = 0
    marker: dict[str, Any] | None = None
    parent_uid: int | None = None
    parent_mode: int | None = None  # with the file type bits' sticky bit: who may put names beside it
    pending: str | None = None  # a restore into it that was interrupted and is not finished yet
    # a folder above the parent that another user could change, and why (issue 37, A1)
    untrusted_above: tuple[Path, str] | None = None

    @property
    def parent_exposure(self) -> str | None:
        """`open` when others may rename or replace the cache itself (a group/world-writable parent
        without the sticky bit, or another user's), `shared` when they may only plant names beside it
        (sticky, as /tmp), None when only its owner (or root) can."""
        if self.parent_mode is None or self.parent_uid is None:
            return None
        return exposure(self.parent_uid, self.parent_mode)  # the rule restore, snapshot and warm enforce

    @property
    def made_for(self) -> BuildFingerprint | None:
        if self.marker and isinstance(self.marker.get("fingerprint"), dict):
            return BuildFingerprint.from_json(self.marker["fingerprint"])
        return None

    @property
    def has_entries(self) -> bool:
        return self.files > (1 if self.marker else 0)

    def absorb(self, walked: Walked) -> None:
        """Add what `walk_folder` found below the folder."""
        files, size, unsafe_count, foreign_count, unsafe, foreign = walked
        self.files += files
        self.size_bytes += size
        self.unsafe_count += unsafe_count
        self.foreign_count += foreign_count
        self.unsafe_writable.extend(unsafe[: SAMPLE - len(self.unsafe_writable)])
        self.foreign_owned.extend(foreign[: SAMPLE - len(self.foreign_owned)])

    def to_json(self) -> dict[str, Any]:
        made_for = self.made_for
        return {
            "label": self.label,
            "path": str(self.path),
            "exists": self.exists,
            "size_bytes": self.size_bytes,
            "files": self.files,
            "fs_type": self.fs_type,
            "volatile": self.volatile,
            "owner_uid": self.owner_uid,
            "mode": f"{self.mode:04o}" if self.mode is not None else None,
            "group_or_world_writable": self.unsafe_writable,
            "group_or_world_writable_count": self.unsafe_count,
            "foreign_owned": self.foreign_owned,
            "foreign_owned_count": self.foreign_count,
            "made_for": made_for.to_json() if made_for else None,
            "snapshot": self.marker.get("snapshot") if self.marker else None,
            "parent_mode": f"{self.parent_mode:04o}" if self.parent_mode is not None else None,
            "parent_uid": self.parent_uid,
            "parent_exposure": self.parent_exposure,
            "interrupted_restore": self.pending,
            "untrusted_above": f"{self.untrusted_above[0]} {self.untrusted_above[1]}"
            if self.untrusted_above
            else None,
        }


def inspect_folder(
    label: str,
    path: Path,
    uid: int | None = None,
    mounts: list[MountInfo] | None = None,
    tempdir: str | None = None,
    walks: StartedWalks | None = None,
) -> FolderReport:
    """Walk one cache folder (no file contents read, except our small marker); `walks`: the walk of its
    entries, when `start_walks` began it beside other work."""
    me = os.getuid() if uid is None else uid
    mounts = read_mounts() if mounts is None else mounts
    report = FolderReport(label, path, exists=False)
    fs_probe = path if path.exists() else _existing_parent(path)
    report.fs_type = filesystem_of(fs_probe, mounts)
    report.volatile = volatility(path, report.fs_type, tempdir)
    try:
        parent = os.stat(_existing_parent(path) if not path.parent.exists() else path.parent)
        report.parent_uid, report.parent_mode = parent.st_uid, stat.S_IMODE(parent.st_mode)
    except OSError:
        pass
    above = untrusted_folder(path.parent.parent)
    report.untrusted_above = (
        above if above is not None and above[0] != Path(os.path.realpath(path.parent)) else None
    )
    try:
        top = os.lstat(path)
    except OSError:
        return report
    if not stat.S_ISDIR(top.st_mode):
        return report
    report.exists = True
    report.owner_uid, report.mode = top.st_uid, stat.S_IMODE(top.st_mode)
    _judge(report, str(path), top, me)
    walked = walks.get(str(path), me) if walks is not None else None
    report.absorb(walked if walked is not None else walk_folder(str(path), me))
    try:
        report.marker = read_marker((path / MARKER_NAME).read_bytes())
    except OSError:
        report.marker = None
    return report


# files, bytes, group/world-writable entries, another user's entries, and up to SAMPLE of each kind (marshal-able:
# a walk started in a forked child sends it back through a pipe)
Walked = tuple[int, int, int, int, list[str], list[str]]


def walk_folder(top: str, me: int) -> Walked:
    """What is below `top`: regular files and their bytes, and the entries (links aside) that others can write
    or that another user owns."""
    sample = FolderReport("", Path(top), exists=True)
    for full, info in _entries(top):
        if stat.S_ISREG(info.st_mode):
            sample.files += 1
            sample.size_bytes += info.st_size
        if not stat.S_ISLNK(info.st_mode):
            _judge(sample, full, info, me)
    return (
        sample.files,
        sample.size_bytes,
        sample.unsafe_count,
        sample.foreign_count,
        sample.unsafe_writable,
        sample.foreign_owned,
    )


class StartedWalks:
    """`walk_folder` of each existing folder, in a forked child started now: a compile cache of ~20k files
    takes ~60 ms to walk on a 2-core box, time the other checks can use."""

    def __init__(self, folders: Iterable[Path], uid: int | None = None) -> None:
        self.me = os.getuid() if uid is None else uid
        self._jobs: dict[str, Started[Walked]] = {}
        try:
            for folder in folders:
                top = str(folder)
                if top not in self._jobs and os.path.isdir(top) and not os.path.islink(top):
                    self._jobs[top] = start_job(functools.partial(walk_folder, top, self.me))
        except BaseException:  # no child left behind by a walk that could not be started
            self.cancel()
            raise

    def get(self, top: str, me: int) -> Walked | None:
        """The walk of `top` for user `me`, or None when none was started for them (the caller walks it)."""
        job = self._jobs.pop(top, None) if me == self.me else None
        return job.results()[0] if job is not None else None

    def cancel(self) -> None:
        while self._jobs:
            self._jobs.popitem()[1].cancel()


def _entries(top: str) -> Iterator[tuple[str, os.stat_result]]:
    """Path and lstat of everything under `top`, links not followed, unreadable folders left out; a stack
    of folders, not recursion: Python 3.11's os.walk recursed, and a tree 1,200 deep ended `cache status`
    and `check` in a RecursionError (issue 37, D1)."""
    pending = [top]
    while pending:
        folder = pending.pop()
        try:
            with os.scandir(folder) as found:
                listed = list(found)
        except OSError:
            continue
        for entry in listed:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            yield entry.path, info
            if stat.S_ISDIR(info.st_mode):
                pending.append(entry.path)


def _judge(report: FolderReport, full: str, info: os.stat_result, me: int) -> None:
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        report.unsafe_count += 1
        if len(report.unsafe_writable) < SAMPLE:
            report.unsafe_writable.append(f"{full} ({stat.S_IMODE(info.st_mode):04o})")
    if info.st_uid != me:
        report.foreign_count += 1
        if len(report.foreign_owned) < SAMPLE:
            report.foreign_owned.append(f"{full} (uid {info.st_uid})")


def _existing_parent(path: Path) -> Path:
    for parent in path.parents:
        if parent.exists():
            return parent
    return Path("/")
