"""A restore's journal, read: which restore into a cache folder was interrupted, and how far it got.

Only what `cache status` and `check` need to say "a restore was interrupted" (`pending_restore`), apart from
the recovery that finishes it (`recovery.py`), so that reading it imports none of the restore machinery.

The journal lives beside the cache, `.<name>.dflash-restore.json`, unless another user took that name first (in
a sticky shared parent anyone may: it blocked every restore of a non-root user; issue 58, JN): then it lives in
this user's lock folder (folder_lock.py), named by the cache folder's place (its parent's device and inode, and
its name), where no one else can create anything.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from dflash_doctor import paths
from dflash_doctor.cache.fsops import read_owned

# A restore stages each root in `.<name>.dflash-staging-<id>` beside it (`swap.py`).
STAGING_TAG = ".dflash-staging-"
JOURNAL_SUFFIX = ".dflash-restore.json"
JOURNAL_SCHEMA = "dflash-doctor/restore-journal/v1"


def journal_path(target: Path) -> Path:
    return target.parent / f".{target.name}{JOURNAL_SUFFIX}"


def aside_name(device: int, inode: int, name: str) -> str:
    """The journal's name in the lock folder, for the cache folder `name` in the folder (device, inode)."""
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:32]
    return f"{device:x}-{inode:x}-{digest}{JOURNAL_SUFFIX}"


def aside_path(target: Path) -> Path | None:
    """Where the journal of `target` lives when its name beside the cache was taken (None: no parent)."""
    try:
        info = os.stat(target.parent)
    except OSError:
        return None
    return paths.lock_root() / aside_name(info.st_dev, info.st_ino, target.name)


def parse_journal(raw: bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if (
        not isinstance(data, dict)
        or data.get("schema") != JOURNAL_SCHEMA
        or data.get("uid") != os.getuid()
        or data.get("phase") not in ("extracting", "swapping")
        or not isinstance(data.get("restore_id"), str)
        or not isinstance(data.get("roots"), dict)
    ):
        return None
    for root in data["roots"].values():
        if not isinstance(root, dict) or not all(isinstance(root.get(k), str) for k in ("target", "staging")):
            return None
        target, staging = Path(root["target"]), Path(root["staging"])
        if staging.parent != target.parent or not staging.name.startswith(f".{target.name}{STAGING_TAG}"):
            return None
        old = root.get("old")
        if old is not None and not (
            isinstance(old, list) and len(old) == 2 and all(type(n) is int for n in old)
        ):
            return None
    return data


def read_journal(target: Path) -> dict[str, Any] | None:
    """Our journal of `target` (a regular file of ours, well-formed), beside it or in the lock folder, or None."""
    found = parse_journal(read_owned(journal_path(target)))
    aside = aside_path(target) if found is None else None
    return parse_journal(read_owned(aside)) if aside is not None else found


def pending_restore(target: Path) -> str | None:
    """A line when a restore into `target` was interrupted and not yet finished (for `cache status`)."""
    journal = read_journal(target)
    if journal is None:
        return None
    return f"restore {journal['restore_id']} was interrupted while {journal['phase']}"
