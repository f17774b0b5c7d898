"""Swapping a verified staging folder into a cache's place, and the previous cache out, through the
handle of the cache's parent (parent_dir.py).

Before anything moves, each target is judged (`judge_target`): absent, or a folder of ours that is a
compile cache by its content (layout.py), not a link, a file, a mount point, another user's folder or a
folder of documents. The swap is one `renameat2(RENAME_EXCHANGE)` in the parent (two renames where the
filesystem cannot exchange); then what sits at the staging name must be the folder the target was when
the restore began (device and inode), or nothing is written into it; it becomes a backup with its
ownership record (backups.py), or, when it is the empty folder the restore made to hold the name, goes.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_base.errors import DoctorError
from dflash_doctor.cache.backups import BackupRecord, Identity, MovedFolderChanged, RecordNotWritten, retire
from dflash_doctor.cache.fsops import is_mount_point_at, kind_of, printable
from dflash_doctor.cache.layout import CacheContent, examine
from dflash_doctor.cache.manifest import MARKER_NAME, CacheManifest, read_marker
from dflash_doctor.cache.parent_dir import ParentDir

# A snapshot holding fewer than a quarter of the files of the cache it replaces: the replaced cache is
# kept out of retention (restored daily, a real cache would otherwise be pruned by tiny or empty archives).
SHRINK_RATIO = 4


@dataclass
class SwapRoot:
    """One root of a restore: the target, its parent's handle, its staging folder's name, and what the
    target was when the restore began (device and inode)."""

    label: str
    target: Path
    parent: ParentDir
    staging: str
    old: Identity | None
    premade: bool = False  # an empty folder this restore made at the target's name
    not_a_cache: bool = False
    kept: str | None = None

    def record(self, restore_id: str) -> BackupRecord:
        return BackupRecord(restore_id, self.target, self.not_a_cache, self.kept)

    def to_json(self) -> dict[str, Any]:
        return {
            "target": str(self.target),
            "staging": str(self.target.parent / self.staging),
            "old": list(self.old) if self.old else None,
            "premade": self.premade,
            "not_a_cache": self.not_a_cache,
            "kept": self.kept,
        }


def marker_at(parent: ParentDir, name: str) -> dict[str, Any] | None:
    """Our marker at the top of the folder `name` of ours, or None."""
    raw = parent.read_in_owned_folder(name, MARKER_NAME)
    return read_marker(raw) if raw is not None else None


def is_our_staging(parent: ParentDir, name: str, restore_id: str) -> bool:
    """A folder of ours whose marker names this restore (a planted folder has neither)."""
    marker = marker_at(parent, name)
    return marker is not None and marker.get("restore_id") == restore_id and marker.get("uid") == os.getuid()


def is_empty(parent: ParentDir, name: str) -> bool:
    try:
        fd = parent.open_folder(name)
    except OSError:
        return False
    try:
        return not os.listdir(fd)
    finally:
        os.close(fd)


def judge_target(root: SwapRoot, replace_non_cache: bool) -> CacheContent | None:
    """What is at the target (None: nothing); a DoctorError when a restore must not move it aside."""
    target, parent = root.target, root.parent
    info = parent.lstat(target.name)
    if info is None:
        return None
    if stat.S_ISLNK(info.st_mode):
        raise DoctorError(
            f"{target} is a symbolic link: a restore would replace the link, not the folder it names",
            hint="point TORCHINDUCTOR_CACHE_DIR at the compile cache folder itself",
        )
    if not stat.S_ISDIR(info.st_mode):
        raise DoctorError(f"{target} is a {kind_of(info.st_mode)}, not a folder", hint="move it away")
    if is_mount_point_at(parent.fd, target.name):  # a bind mount too (`docker -v host:<cache>`; B1)
        raise DoctorError(
            f"{target} is a mount point (a bind mount of a host folder, say): a restore replaces the folder "
            "itself, which a mount cannot be; nothing was written",
            hint=f"point TORCHINDUCTOR_CACHE_DIR at a folder inside it, e.g. {target / 'inductor'}",
        )
    if info.st_uid != os.getuid():
        raise DoctorError(
            f"{target} belongs to uid {info.st_uid}, not to you",
            hint="point TORCHINDUCTOR_CACHE_DIR at a compile cache folder of yours",
        )
    fd = parent.open_folder(target.name)
    try:
        content = examine(fd)
    finally:
        os.close(fd)
    if content.reason and not replace_non_cache:
        raise DoctorError(
            f"{target} does not look like a compile cache: {content.reason}. Nothing was moved "
            "(--replace-non-cache moves it aside anyway, kept as a backup that is never deleted)",
            hint="point TORCHINDUCTOR_CACHE_DIR at a compile cache folder",
        )
    root.not_a_cache = content.reason is not None
    if content.strangers and not root.not_a_cache:  # a cache, with a few entries that may be a person's
        root.kept = f"it held entries no compiler writes: {content.named()}"
    return content


def check_shrink(root: SwapRoot, content: CacheContent | None, manifest: CacheManifest, force: bool) -> None:
    """An archive with no files for a root whose cache holds some: --force; far fewer: the replaced cache
    is kept out of retention (N6)."""
    live = content.files if content is not None else 0
    archived = sum(1 for entry in manifest.files if entry.path.partition("/")[0] == root.label)
    if not live or archived * SHRINK_RATIO >= live:
        return
    if not archived and not force:
        raise DoctorError(
            f"snapshot {printable(manifest.name)!r} holds no {root.label} files, and {root.target} holds "
            f"{live}: restoring it would leave an empty cache",
            hint="restore it anyway with --force (the cache is then kept as a backup that is never deleted)",
        )
    root.kept = f"a snapshot of {archived} files replaced its {live}"


def swap(root: SwapRoot, restore_id: str, pause: Callable[[], None]) -> str | None:
    """Put the verified staging folder at the target; return the name the previous cache went to (None
    when it was the empty folder this restore made, removed)."""
    parent, name = root.parent, root.target.name
    if root.old is None:  # nothing at the target (recovery after a kill between the two renames)
        parent.rename_noreplace(root.staging, name)
        return None
    if parent.exchange(root.staging, name):
        pause()
        return retire_previous(root, root.staging, restore_id)
    unrecorded: RecordNotWritten | None = None
    try:
        backup = retire_previous(root, name, restore_id)  # two renames: target -> backup first
    except RecordNotWritten as exc:  # moved aside, its record found no room: the new cache still goes in
        backup, unrecorded = exc.backup, exc
    pause()
    try:
        parent.rename_noreplace(root.staging, name)
    except FileExistsError:
        info = parent.lstat(name)
        what = f"a {kind_of(info.st_mode)} of uid {info.st_uid}" if info is not None else "something"
        kept = f"the previous cache is at {parent.path / backup}" if backup else "the target was empty"
        raise DoctorError(
            f"{root.target} appeared while the previous cache was moved aside ({what}): nothing was "
            f"written through it; {kept}, the new one waits at {parent.path / root.staging}",
            hint="if you did not make it, another user did: point TORCHINDUCTOR_CACHE_DIR at a folder "
            "only you can write",
        ) from None
    if unrecorded is not None:
        raise unrecorded
    return backup


def retire_previous(root: SwapRoot, name: str, restore_id: str) -> str | None:
    """The previous cache, now at `name`: checked to be the folder the target was (device and inode),
    then kept as a backup with its record, or, when it is the empty folder this restore made, removed."""
    parent = root.parent
    if parent.identity(name) != root.old:
        raise DoctorError(
            f"{parent.path / name} is not the folder that was at {root.target} when the restore began: "
            "another process replaced it; it is left alone, nothing was written into it",
            hint="see who else writes that folder; `dflash-doctor cache status` shows it",
        )
    if root.premade and is_empty(parent, name):
        os.rmdir(name, dir_fd=parent.fd)
        return None
    try:
        return retire(parent, name, root.old, root.record(restore_id))
    except MovedFolderChanged as exc:
        raise DoctorError(f"{exc}: it is left alone, nothing was written into it") from None
