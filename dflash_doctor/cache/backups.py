"""The previous caches a restore keeps, `<name>.bak-<restore id>` beside the cache, and the retention
that deletes the oldest of them.

A backup is ours when it is a folder of this user holding our ownership record
(`.dflash-doctor-backup.json`: restore id, uid, time, target), written through a handle of the folder
after its device and inode were checked to be the folder the restore moved. Retention keeps the newest
KEEP_BACKUPS of ours in the order they were made (a sequence each record carries, not the clock: issue 58,
C2), never by name, and never deletes:
- a backup marked kept: a folder that was not a cache (`--replace-non-cache`), or a cache that a far
  smaller snapshot replaced (issue 30, N6: three empty restores used to prune the real cache);
- a backup whose content is not a compile cache's (layout.py): a folder of documents taken for a cache
  before the content rule (N2).
Anything else named like a backup is left alone and reported.

Deleting one (N7): it is renamed first to `.<name>.dflash-doomed-<random>`, so it is no longer a backup
for anyone, then emptied through handles with its ownership record last. A kill midway leaves a doomed
folder of ours that still holds its record, or nothing at all; the next restore or snapshot finishes it.
A doomed folder with content but no record is not ours to delete: left alone and reported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_doctor.cache.archive import is_our_record
from dflash_doctor.cache.fsops import identity, read_owned_at, write_atomic_at
from dflash_doctor.cache.layout import examine
from dflash_doctor.cache.manifest import BACKUP_OWNER_NAME, backup_owner_bytes, read_backup_owner
from dflash_doctor.cache.parent_dir import ParentDir

BACKUP_TAG = ".bak-"
DOOMED_TAG = ".dflash-doomed-"
KEEP_BACKUPS = 2  # a 350 MB cache restored daily must not fill the disk with old copies

Identity = tuple[int, int]


class MovedFolderChanged(Exception):
    """What sits at a name is not the folder a restore moved there: nothing is written into it."""


class RecordNotWritten(OSError):
    """The previous cache is at its backup name `backup`, but the disk had no room (no inode) for its
    ownership record: left as a kill between the rename and the record leaves it, which recovery finishes
    from the journal (issue 37, B5). An OSError still, for every caller that does not tell it apart."""

    backup: str


@dataclass(frozen=True)
class BackupRecord:
    """What a backup's ownership record says besides its name."""

    restore_id: str
    target: Path
    not_a_cache: bool = False
    kept: str | None = None  # why retention leaves it alone
    sequence: int | None = None  # its place in the order backups of this target were made (C2)

    def to_bytes(self) -> bytes:
        return backup_owner_bytes(
            self.restore_id, str(self.target), time.time(), self.not_a_cache, self.kept, self.sequence
        )


def backup_name(target: Path, restore_id: str) -> str:
    return f"{target.name}{BACKUP_TAG}{restore_id}"


def remove_torn_records_at(folder: int) -> None:
    """Temp files of ours a kill left at a cache folder's top while a record was being written."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if name.endswith(".tmp") and is_our_record(name) and read_owned_at(folder, name) is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=folder)


def age_order(owner: dict[str, Any], now: float | None = None) -> tuple[int, float, float]:
    """A backup's place among the others, oldest first: its sequence when recorded (after every backup made
    before sequences were), then its creation time, a time in the future counted as the oldest (a clock that
    was wrong then says nothing of its age; issue 58, C2: a backup made 10 years ahead was kept for 10 years
    while the real newer ones went)."""
    sequence = owner.get("sequence")
    created = float(owner.get("created", 0.0))
    if created > (time.time() if now is None else now) + FUTURE_SLACK_S:
        created = float("-inf")
    if isinstance(sequence, int) and not isinstance(sequence, bool):
        return 1, float(sequence), created
    return 0, created, 0.0


FUTURE_SLACK_S = 300.0  # a creation time this far past the clock now was made by a clock running ahead


def next_sequence(parent: ParentDir, target: Path) -> int:
    """One more than the highest sequence among our backups of `target` (the caller holds its folder's lock)."""
    highest = 0
    for name in parent.names():
        if name.startswith(f"{target.name}{BACKUP_TAG}"):
            owner = backup_owner(parent, name, target)
            sequence = owner.get("sequence") if owner is not None else None
            if isinstance(sequence, int) and not isinstance(sequence, bool):
                highest = max(highest, sequence)
    return highest + 1


def give_record(parent: ParentDir, name: str, expected: Identity | None, record: BackupRecord) -> None:
    """Write the ownership record into the folder at `name`, through its handle, once that handle shows
    the folder we moved (device and inode `expected`; None: any folder of ours). A record without a sequence
    gets the next one of its target's backups."""
    if record.sequence is None:
        record = dataclasses.replace(record, sequence=next_sequence(parent, record.target))
    fd = parent.open_folder(name)
    try:
        info = os.fstat(fd)
        if (expected is not None and identity(info) != expected) or info.st_uid != os.getuid():
            raise MovedFolderChanged(f"{parent.path / name} is not the folder this restore moved there")
        remove_torn_records_at(fd)
        write_atomic_at(fd, BACKUP_OWNER_NAME, record.to_bytes())
    finally:
        os.close(fd)


def retire(parent: ParentDir, name: str, expected: Identity | None, record: BackupRecord) -> str:
    """Rename the previous cache at `name`, never over anything, to a free `<target>.bak-<id>...`, check
    that what sits there now is the folder we moved, then give it its record. Returns its name.
    Nothing is written into a folder while it is live: a kill between the rename and the record leaves a
    backup of ours named for this restore, which recovery gives its record."""
    backup = backup_name(record.target, record.restore_id)
    while True:
        try:
            parent.rename_noreplace(name, backup)
            break
        except FileExistsError:  # planted, or left by a restore of the same id: take another name
            backup = backup_name(record.target, f"{record.restore_id}-{secrets.token_hex(4)}")
    if expected is not None and parent.identity(backup) != expected:
        raise MovedFolderChanged(f"{parent.path / backup} is not the folder this restore moved there")
    try:
        give_record(parent, backup, expected, record)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        unrecorded = RecordNotWritten(exc.errno, exc.strerror, str(parent.path / backup / BACKUP_OWNER_NAME))
        unrecorded.backup = backup
        raise unrecorded from None
    return backup


def unowned_backups(parent: ParentDir, target: Path, restore_id: str) -> list[str]:
    """This restore's backups that a kill left without their record: folders of ours named for it."""
    prefix = backup_name(target, restore_id)
    return [
        name
        for name in parent.names()
        if name.startswith(prefix) and parent.owned_folder(name) and _record_of(parent, name) is None
    ]


def _record_of(parent: ParentDir, name: str) -> dict[str, Any] | None:
    raw = parent.read_in_owned_folder(name, BACKUP_OWNER_NAME)
    return read_backup_owner(raw) if raw is not None else None


def backup_owner(parent: ParentDir, name: str, target: Path) -> dict[str, Any] | None:
    """The ownership record of the backup `name` of `target`, when it is ours."""
    owner = _record_of(parent, name)
    return owner if owner is not None and owner.get("target") == str(target) else None


def _looks_like_cache(parent: ParentDir, name: str) -> bool:
    """Provably a compile cache: every entry one a compiler writes (a stray may be a person's file)."""
    try:
        fd = parent.open_folder(name)
    except OSError:
        return False
    try:
        return not examine(fd).strangers
    finally:
        os.close(fd)


def prune_backups(
    target: Path, keep: int = KEEP_BACKUPS, current: str | None = None, parent: ParentDir | None = None
) -> list[Path]:
    """Delete all but the newest `keep` of *our* backups of `target` (`age_order`), `current` (this
    restore's) always kept, kept ones and ones that are not a cache never deleted. The caller holds the
    folder's lock. Returns what was deleted."""
    if parent is None:
        if not target.parent.is_dir():
            return []
        with ParentDir.open(target.parent, make=False) as opened:
            return prune_backups(target, keep, current, opened)
    finish_deletions(parent, target)
    ours: list[tuple[tuple[int, float, float], str, Identity]] = []
    for name in parent.names():
        if not name.startswith(f"{target.name}{BACKUP_TAG}") or name == current:
            continue
        owner = backup_owner(parent, name, target)
        found = parent.identity(name)
        if owner is None or found is None or owner.get("not_a_cache") or owner.get("kept"):
            continue
        if _looks_like_cache(parent, name):
            ours.append((age_order(owner), name, found))
    ours.sort(key=lambda item: item[0], reverse=True)
    room = max(keep - (1 if current is not None else 0), 0)
    deleted = []
    for _, name, found in ours[room:]:
        if _delete(parent, target, name, found):
            deleted.append(parent.path / name)
    return deleted


def _delete(parent: ParentDir, target: Path, name: str, expected: Identity) -> bool:
    doomed = f".{target.name}{DOOMED_TAG}{secrets.token_hex(8)}"
    try:
        parent.rename_noreplace(name, doomed)
    except OSError:
        return False
    if parent.identity(doomed) != expected:  # not what we judged: put nothing at risk, leave it
        return False
    parent.remove_tree(doomed, last=BACKUP_OWNER_NAME)
    return True


def finish_deletions(parent: ParentDir, target: Path) -> list[str]:
    """Finish deleting the doomed folders a kill left beside `target`: ours, holding their record or
    nothing at all (the record goes last). Returns what was done."""
    done = []
    for name in parent.names():
        if not name.startswith(f".{target.name}{DOOMED_TAG}") or not parent.owned_folder(name):
            continue
        fd = parent.open_folder(name)
        try:
            empty = not os.listdir(fd)
            ours = empty or read_backup_owner(read_owned_at(fd, BACKUP_OWNER_NAME)) is not None
        finally:
            os.close(fd)
        if ours:
            parent.remove_tree(name, last=BACKUP_OWNER_NAME)
            done.append(f"finished deleting an old backup ({parent.path / name})")
    return done


def strangers(parent: ParentDir, target: Path, staging_tag: str) -> list[str]:
    """Staging, backup or doomed names beside `target` that are not ours to touch: reported, never moved."""
    found = []
    for name in parent.names():
        path = parent.path / name
        if name.startswith(f".{target.name}{staging_tag}"):
            found.append(f"{path}: a staging folder no restore of yours is finishing; left alone")
        elif name.startswith(f".{target.name}{DOOMED_TAG}"):
            found.append(f"{path}: a folder being deleted that is not this tool's; left alone")
        elif name.startswith(f"{target.name}{BACKUP_TAG}"):
            owner = backup_owner(parent, name, target)
            info = parent.lstat(name)
            if owner is None:
                found.append(f"{path}: not a backup this tool made for {target}; left alone")
            elif (
                not owner.get("not_a_cache")
                and not owner.get("kept")
                and info is not None
                and stat.S_ISDIR(info.st_mode)
                and not _looks_like_cache(parent, name)
            ):
                found.append(
                    f"{path}: a backup that is not provably a compile cache: never deleted, remove it yourself"
                )
    return found
