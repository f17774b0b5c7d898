"""Finishing what a killed restore left: its journal says which staging folder belongs to which target,
what each target was, and how far the restore got.

The journal lives beside the first target, `.<name>.dflash-restore.json`: ours, written at a random name
and renamed through the parent's handle, read back only when it is a regular file of ours; where another user
took that name first, in this user's lock folder instead (`JournalFile`; issue 58, JN). Recovery (the
first step of the next restore or snapshot, under the folder locks) reads only that: phase `extracting`
-> the staging folders are deleted (when their marker, or the journal and our uid, prove them ours), and
a target the restore made to hold the name is removed while still empty; phase `swapping` -> every root
is rolled forward (its staging was verified): swapped where not yet, the old cache moved to its backup
where the exchange was done. So all roots of one restore are new together or old together. Deletions of
old backups a kill cut short are finished too (backups.finish_deletions).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from dflash_base.errors import DoctorError
from dflash_doctor import paths
from dflash_doctor.cache import fsops
from dflash_doctor.cache.backups import MovedFolderChanged, finish_deletions, give_record, unowned_backups
from dflash_doctor.cache.journal import aside_name, journal_path, parse_journal
from dflash_doctor.cache.parent_dir import ParentDir, lock_folder_remedy, open_trusted
from dflash_doctor.cache.swap import (
    SwapRoot,
    is_empty,
    is_our_staging,
    judge_target,
    marker_at,
    retire_previous,
    swap,
)


class JournalFile:
    """A restore's journal of the cache `target`: beside it (`.<name>.dflash-restore.json`, through the parent's
    handle), or, when another user took that name (JN), in this user's lock folder (journal.py). Only a file of
    ours is ever read, replaced or removed: another user's file at the name is left as it is."""

    def __init__(self, parent: ParentDir, target: Path) -> None:
        self.parent, self.target = parent, target
        self.beside = journal_path(target).name
        info = os.fstat(parent.fd)
        self.aside = aside_name(info.st_dev, info.st_ino, target.name)

    def _taken(self) -> bool:
        info = self.parent.lstat(self.beside)
        return info is not None and (info.st_uid != os.getuid() or not stat.S_ISREG(info.st_mode))

    def write(self, data: dict[str, Any]) -> None:
        raw = json.dumps(data, indent=1).encode()
        if not self._taken():
            try:
                self.parent.write_atomic(self.beside, raw)
                return
            except PermissionError:  # taken meanwhile by someone else: aside, as below
                pass
        with _lock_folder() as folder:
            fsops.write_atomic_at(folder, self.aside, raw)
        if self.parent.read_owned(self.beside) is not None:  # an older journal of ours: no longer the one
            self.parent.unlink(self.beside)

    def read(self) -> dict[str, Any] | None:
        found = parse_journal(self.parent.read_owned(self.beside))
        if found is not None or not paths.lock_root().is_dir():
            return found
        with _lock_folder() as folder:
            return parse_journal(fsops.read_owned_at(folder, self.aside))

    def remove(self) -> None:
        if self.parent.read_owned(self.beside) is not None:  # ours (another user's file is left alone)
            self.parent.unlink(self.beside)
        if paths.lock_root().is_dir():
            with _lock_folder() as folder, contextlib.suppress(FileNotFoundError):
                os.unlink(self.aside, dir_fd=folder)


@contextmanager
def _lock_folder() -> Iterator[int]:
    """This user's lock folder (made 0700), opened and judged like a cache's parent."""
    root = paths.lock_root()
    paths.make_private_dirs(root)
    fd = open_trusted(root, "the lock folder", lock_folder_remedy)
    try:
        yield fd
    finally:
        os.close(fd)


def write_journal(parent: ParentDir, target: Path, data: dict[str, Any]) -> None:
    JournalFile(parent, target).write(data)


@contextmanager
def _parents_of(journal: dict[str, Any], known: Mapping[Path, ParentDir]) -> Iterator[dict[Path, ParentDir]]:
    """The parent handle of every target the journal names (those not held by the caller, opened)."""
    with ExitStack() as stack:
        handles: dict[Path, ParentDir] = {}
        for entry in journal["roots"].values():
            target = Path(entry["target"])
            held = next((p for t, p in known.items() if t.parent == target.parent), None)
            handles[target] = held or stack.enter_context(ParentDir.open(target.parent, make=False))
        yield handles


def _roots_of(journal: dict[str, Any], parents: Mapping[Path, ParentDir]) -> list[SwapRoot]:
    roots = []
    for label, entry in journal["roots"].items():
        target = Path(entry["target"])
        old = entry.get("old")
        roots.append(
            SwapRoot(
                label,
                target,
                parents[target],
                Path(entry["staging"]).name,
                (old[0], old[1]) if old else None,
                bool(entry.get("premade")),
                bool(entry.get("not_a_cache")),
                entry.get("kept") if isinstance(entry.get("kept"), str) else None,
            )
        )
    return roots


def _finish(journal: dict[str, Any], roots: list[SwapRoot]) -> list[str]:
    restore_id, actions = journal["restore_id"], []
    for root in roots:
        parent, name = root.parent, root.target.name
        if journal["phase"] == "extracting":
            # Killed between its mkdir and its marker, a staging folder has no marker yet: the journal
            # naming it and our uid on it prove it ours (no one else can make a folder of ours).
            marker = marker_at(parent, root.staging)
            if parent.owned_folder(root.staging) and (
                marker is None or marker.get("restore_id") == restore_id
            ):
                parent.remove_tree(root.staging)
                actions.append(f"removed an unfinished staging folder {parent.path / root.staging}")
            if root.premade and parent.identity(name) == root.old and is_empty(parent, name):
                os.rmdir(name, dir_fd=parent.fd)
            continue
        marker = marker_at(parent, name)
        if marker is not None and marker.get("restore_id") == restore_id:  # swapped in already
            info = parent.lstat(root.staging)
            if info is not None and stat.S_ISDIR(info.st_mode):  # the old cache, after the exchange
                if root.old is None and parent.owned_folder(root.staging):  # a journal of issue 21's time
                    root.old = parent.identity(root.staging)
                actions.append(_retire_in_recovery(root, restore_id))
        elif is_our_staging(parent, root.staging, restore_id):  # verified, not swapped yet: roll forward
            root.old = parent.identity(name)
            content = judge_target(root, replace_non_cache=root.not_a_cache)
            root.premade = root.premade and content is not None and not content.files
            backup = swap(root, restore_id, lambda: None)
            kept = f" (previous kept as {parent.path / backup})" if backup else ""
            actions.append(f"finished swapping in {root.target}{kept}")
        for backup in unowned_backups(parent, root.target, restore_id):
            try:
                give_record(parent, backup, root.old, root.record(restore_id))
                actions.append(f"kept the previous cache as {parent.path / backup}")
            except MovedFolderChanged as exc:
                actions.append(f"{exc}; left alone")
    return actions


def untouched(roots: list[SwapRoot], restore_id: str) -> bool:
    """No root of this restore was swapped yet: every target is still the folder it was."""
    for root in roots:
        marker = marker_at(root.parent, root.target.name)
        if marker is not None and marker.get("restore_id") == restore_id:
            return False
        if root.old is not None and root.parent.identity(root.target.name) != root.old:
            return False
    return True


def roll_back(roots: list[SwapRoot], restore_id: str) -> list[str]:
    """Undo a restore that cannot be swapped in (a mount point: EBUSY), while no root was swapped: its
    staging folders (ours, by their marker) and the empty targets it made go; the caches stay."""
    actions = []
    for root in roots:
        parent, name = root.parent, root.target.name
        if is_our_staging(parent, root.staging, restore_id):
            parent.remove_tree(root.staging)
            actions.append(
                f"rolled back restore {restore_id}: removed its staging folder {parent.path / root.staging}"
            )
        if root.premade and parent.identity(name) == root.old and is_empty(parent, name):
            os.rmdir(name, dir_fd=parent.fd)
    return actions


def _retire_in_recovery(root: SwapRoot, restore_id: str) -> str:
    try:
        backup = retire_previous(root, root.staging, restore_id)
    except DoctorError as exc:
        return exc.message
    return f"kept the previous cache as {root.parent.path / backup}" if backup else "removed an empty folder"


def recover_interrupted(target: Path, parent: ParentDir | None = None) -> list[str]:
    """Finish what a killed restore's journal beside `target` says, and deletions a kill left; say what
    was done. The caller holds the folder locks (and may pass the parent's handle they gave). Staging
    folders no journal of ours names are left alone (see `strangers`)."""
    if parent is None:
        if not target.parent.is_dir():
            return []
        with ParentDir.open(target.parent, make=False) as opened:
            return recover_interrupted(target, opened)
    actions = finish_deletions(parent, target)
    _remove_torn_journals(parent, target)
    journal_file = JournalFile(parent, target)
    journal = journal_file.read()
    if journal is None:
        return actions
    with _parents_of(journal, {target: parent}) as parents:
        roots = _roots_of(journal, parents)
        try:
            actions += _finish(journal, roots)
        except OSError as exc:  # cannot roll forward (the exchange refused: EBUSY): roll back if untouched
            if journal["phase"] != "swapping" or not untouched(roots, journal["restore_id"]):
                raise
            actions += roll_back(roots, journal["restore_id"])
            actions.append(f"(it could not be swapped in: {exc.strerror}); the caches were left as they were")
    journal_file.remove()
    return actions


def _remove_torn_journals(parent: ParentDir, target: Path) -> None:
    """Temp files of ours a kill left while the journal was being written (`.<journal>.<random>.tmp`)."""
    prefix = f".{journal_path(target).name}."
    for name in parent.names():
        if name.startswith(prefix) and name.endswith(".tmp") and parent.read_owned(name) is not None:
            parent.unlink(name)
