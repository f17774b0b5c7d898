"""Restore a snapshot so that a crash at any moment leaves the old caches or the new ones, whole, all
roots together, and so that nothing planted beside the cache is ever moved in or deleted.

Under the lock of every cache folder it touches (folder_lock.py), whichever home it comes from:
1. each target must be absent or a folder of ours that looks like a compile cache (not a link, a file,
   a mount point, another user's folder or a folder of documents) before anything is written;
2. a journal beside the first target, `.<name>.dflash-restore.json` (ours: created at a random name and
   renamed; read back only when it is our regular file), names this restore's id and, per root, its
   staging folder `.<name>.dflash-staging-<random>`: a name nobody can guess, made with `mkdir` (never
   an existing one), our marker inside naming the restore id, uid and time;
3. every member is checked and extracted into the staging folders, every sha256 verified;
4. the journal moves to phase `swapping`; then per root one `renameat2(RENAME_EXCHANGE)` (two renames
   where the filesystem cannot exchange) puts the new cache in place; the previous one gets an ownership
   record (restore id, uid, time) and is renamed, never over anything, to `<name>.bak-<id>`;
5. the journal is removed; backups beyond the newest KEEP_BACKUPS *of ours* (by recorded time) go.

Recovery (`recover_interrupted`, the first step of the next restore or snapshot) reads only our journal:
phase `extracting` -> its staging folders are deleted (when their marker proves them ours); phase
`swapping` -> every root is rolled forward (its staging was verified): swapped where not yet, the old
cache moved to its backup where the exchange was done. Anything else beside the cache is left alone
and reported.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_base.atomic import write_bytes_atomic
from dflash_base.errors import DoctorError
from dflash_doctor.cache.archive import is_our_record
from dflash_doctor.cache.extract import ReadLimits, extract_verified
from dflash_doctor.cache.fingerprint import BuildFingerprint, incompatibilities
from dflash_doctor.cache.folder_lock import TIMEOUT_S, folder_locks
from dflash_doctor.cache.fsops import exchange, kind_of, owned_folder, printable, read_owned, rename_noreplace
from dflash_doctor.cache.inspection import not_a_cache_reason
from dflash_doctor.cache.manifest import (
    BACKUP_OWNER_NAME,
    MARKER_NAME,
    ArchiveError,
    CacheManifest,
    backup_owner_bytes,
    marker_bytes,
    read_backup_owner,
    read_marker,
)

STAGING_TAG = ".dflash-staging-"
BACKUP_TAG = ".bak-"
JOURNAL_SUFFIX = ".dflash-restore.json"
JOURNAL_SCHEMA = "dflash-doctor/restore-journal/v1"
# Test hook: seconds to sleep after each file and between swap steps, so a test can SIGKILL the
# process at every stage. It only adds sleeps; the code path is the production one.
PAUSE_VARIABLE = "DFLASH_DOCTOR_RESTORE_PAUSE"
KEEP_BACKUPS = 2  # a 350 MB cache restored daily must not fill the disk with old copies


@dataclass
class RestoreResult:
    manifest: CacheManifest
    targets: dict[str, Path]
    backups: dict[str, Path] = field(default_factory=dict)
    forced_over: list[str] = field(default_factory=list)  # fingerprint differences accepted by --force
    recovered: list[str] = field(default_factory=list)
    left_alone: list[str] = field(default_factory=list)  # things beside the cache that are not ours
    seconds: float = 0.0


def staging_path(target: Path, token: str) -> Path:
    return target.parent / f".{target.name}{STAGING_TAG}{token}"


def backup_path(target: Path, restore_id: str) -> Path:
    return target.parent / f"{target.name}{BACKUP_TAG}{restore_id}"


def journal_path(target: Path) -> Path:
    return target.parent / f".{target.name}{JOURNAL_SUFFIX}"


def new_restore_id(now: float | None = None) -> str:
    """`20261201T031500Z-<random>`: UTC, so ids never run backwards across a clock change (DST)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{secrets.token_hex(3)}"


def _pause() -> None:
    delay = os.environ.get(PAUSE_VARIABLE)
    if delay:
        time.sleep(float(delay))


_UNPATCHED_PAUSE = _pause


def _per_file_hook() -> Callable[[str], None] | None:
    """`_pause` after each file, when a pause is asked for or a test replaced `_pause`; else nothing
    (9000 environment lookups cost 25 ms of a 0.5 s restore)."""
    if _pause is _UNPATCHED_PAUSE and not os.environ.get(PAUSE_VARIABLE):
        return None
    return lambda _: _pause()


# -- ownership


def _marker_of(folder: Path) -> dict[str, Any] | None:
    raw = read_owned(folder / MARKER_NAME) if owned_folder(folder) else None
    return read_marker(raw) if raw is not None else None


def _is_our_staging(staging: Path, restore_id: str) -> bool:
    """A folder of ours whose marker names this restore (a planted folder has neither)."""
    marker = _marker_of(staging)
    return marker is not None and marker.get("restore_id") == restore_id and marker.get("uid") == os.getuid()


def remove_torn_records(folder: Path) -> None:
    """Temp files of ours a kill left at a cache folder's top while a record was being written."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if name.endswith(".tmp") and is_our_record(name) and read_owned(folder / name) is not None:
            (folder / name).unlink(missing_ok=True)


def _retire(old: Path, target: Path, restore_id: str, not_a_cache: bool) -> Path:
    """Rename the previous cache, never over anything, to a free `<name>.bak-<id>...`, then put our
    ownership record in it. Nothing is written into a folder while it is live: a kill between the two
    leaves a backup of ours (our uid, this restore's id in its name) that recovery gives its record."""
    backup = backup_path(target, restore_id)
    while True:
        try:
            rename_noreplace(old, backup)
            break
        except FileExistsError:  # planted, or left by a restore of the same id: take another name
            backup = backup_path(target, f"{restore_id}-{secrets.token_hex(4)}")
    _own_backup(backup, target, restore_id, not_a_cache)
    return backup


def _own_backup(backup: Path, target: Path, restore_id: str, not_a_cache: bool) -> None:
    remove_torn_records(backup)
    record = backup_owner_bytes(restore_id, str(target), time.time(), not_a_cache)
    write_bytes_atomic(backup / BACKUP_OWNER_NAME, record)


def _unowned_backups(target: Path, restore_id: str) -> list[Path]:
    """This restore's backups that a kill left without their record: folders of ours named for it."""
    prefix = f"{target.name}{BACKUP_TAG}{restore_id}"
    try:
        names = os.listdir(target.parent)
    except OSError:
        return []
    return [
        target.parent / name
        for name in names
        if name.startswith(prefix)
        and owned_folder(target.parent / name)
        and read_owned(target.parent / name / BACKUP_OWNER_NAME) is None
    ]


def _swap(staging: Path, target: Path, restore_id: str, not_a_cache: bool) -> Path | None:
    """Put the verified staging folder at `target`; return where the previous cache went."""
    if not os.path.lexists(target):
        rename_noreplace(staging, target)
        return None
    if exchange(staging, target):
        _pause()
        return _retire(staging, target, restore_id, not_a_cache)
    backup = _retire(target, target, restore_id, not_a_cache)  # two renames: target -> backup first
    _pause()
    rename_noreplace(staging, target)
    return backup


# -- the journal


def _write_journal(path: Path, data: dict[str, Any]) -> None:
    try:
        write_bytes_atomic(path, json.dumps(data, indent=1).encode())
    except PermissionError:
        raise DoctorError(
            f"{path} belongs to someone else: another user is restoring into this cache's folder",
            hint="point TORCHINDUCTOR_CACHE_DIR at a folder only you can write",
        ) from None


def read_journal(target: Path) -> dict[str, Any] | None:
    """Our journal beside `target` (a regular file of ours, well-formed), or None."""
    raw = read_owned(journal_path(target))
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
        target_path, staging = Path(root["target"]), Path(root["staging"])
        if staging.parent != target_path.parent or not staging.name.startswith(
            f".{target_path.name}{STAGING_TAG}"
        ):
            return None
    return data


def pending_restore(target: Path) -> str | None:
    """A line when a restore into `target` was interrupted and not yet finished (for `cache status`)."""
    journal = read_journal(target)
    if journal is None:
        return None
    return f"restore {journal['restore_id']} was interrupted while {journal['phase']}"


def _finish(journal: dict[str, Any]) -> list[str]:
    restore_id, actions = journal["restore_id"], []
    for root in journal["roots"].values():
        target, staging = Path(root["target"]), Path(root["staging"])
        not_a_cache = bool(root.get("not_a_cache"))
        if journal["phase"] == "extracting":
            # Killed between its mkdir and its marker, a staging folder has no marker yet: the journal
            # naming it and our uid on it prove it ours (no one else can make a folder of ours).
            marker = _marker_of(staging)
            if owned_folder(staging) and (marker is None or marker.get("restore_id") == restore_id):
                shutil.rmtree(staging, ignore_errors=True)
                actions.append(f"removed an unfinished staging folder {staging}")
            continue
        marker = _marker_of(target)
        if marker is not None and marker.get("restore_id") == restore_id:  # swapped in already
            info = _lstat(staging)
            if info is not None and stat.S_ISDIR(info.st_mode):  # the old cache, after the exchange
                backup = _retire(staging, target, restore_id, not_a_cache)
                actions.append(f"kept the previous cache as {backup}")
        elif _is_our_staging(staging, restore_id):  # verified, not swapped yet: roll forward
            backup = _swap(staging, target, restore_id, not_a_cache)
            kept = f" (previous kept as {backup})" if backup else ""
            actions.append(f"finished swapping in {target}{kept}")
        for backup in _unowned_backups(target, restore_id):
            _own_backup(backup, target, restore_id, not_a_cache)
            actions.append(f"kept the previous cache as {backup}")
    return actions


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def recover_interrupted(target: Path) -> list[str]:
    """Finish what a killed restore's journal beside `target` says; say what was done. The caller holds
    the folder locks. Staging folders no journal of ours names are left alone (see `strangers`)."""
    _remove_torn_journals(target)
    journal = read_journal(target)
    if journal is None:
        return []
    actions = _finish(journal)
    journal_path(target).unlink(missing_ok=True)
    return actions


def _remove_torn_journals(target: Path) -> None:
    """Temp files of ours a kill left while the journal was being written (`.<journal>.<random>.tmp`)."""
    prefix = f".{journal_path(target).name}."
    try:
        names = os.listdir(target.parent)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix) and name.endswith(".tmp") and read_owned(target.parent / name) is not None:
            (target.parent / name).unlink(missing_ok=True)


def strangers(target: Path) -> list[str]:
    """Staging or backup names beside `target` that are not ours to touch: reported, never moved."""
    found = []
    parent = target.parent
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return found
    for name in names:
        path = parent / name
        if name.startswith(f".{target.name}{STAGING_TAG}"):
            found.append(f"{path}: a staging folder no restore of yours is finishing; left alone")
        elif name.startswith(f"{target.name}{BACKUP_TAG}") and _backup_owner(path, target) is None:
            found.append(f"{path}: not a backup this tool made for {target}; left alone")
    return found


# -- retention


def _backup_owner(path: Path, target: Path) -> dict[str, Any] | None:
    if not owned_folder(path):
        return None
    owner = read_backup_owner(read_owned(path / BACKUP_OWNER_NAME))
    return owner if owner is not None and owner.get("target") == str(target) else None


def prune_backups(target: Path, keep: int = KEEP_BACKUPS, current: Path | None = None) -> list[Path]:
    """Delete all but the newest `keep` of *our* backups of `target`, newest by their recorded creation
    time (never by name); `current` (this restore's) is always kept. A backup of a folder that was not
    a cache (`--replace-non-cache`) is never deleted. Returns what was deleted."""
    ours: list[tuple[float, Path]] = []
    try:
        names = os.listdir(target.parent)
    except OSError:
        return []
    for name in names:
        path = target.parent / name
        if not name.startswith(f"{target.name}{BACKUP_TAG}") or path == current:
            continue
        owner = _backup_owner(path, target)
        if owner is not None and not owner.get("not_a_cache"):
            ours.append((float(owner["created"]), path))
    ours.sort(key=lambda item: item[0], reverse=True)
    room = keep - (1 if current is not None else 0)
    doomed = [path for _, path in ours[max(room, 0) :]]
    for backup in doomed:
        shutil.rmtree(backup, ignore_errors=True)
    return doomed


# -- the targets


def target_refusal(target: Path, replace_non_cache: bool = False) -> str | None:
    """Why a restore must not move `target` aside (None: it may)."""
    info = _lstat(target)
    if info is None:
        return None
    if stat.S_ISLNK(info.st_mode):
        return f"{target} is a symbolic link: a restore would replace the link, not the folder it names"
    if not stat.S_ISDIR(info.st_mode):
        return f"{target} is a {kind_of(info.st_mode)}, not a folder"
    if os.path.ismount(target):
        return (
            f"{target} is a mount point: a restore replaces the folder itself, which a mount cannot be; "
            f"point TORCHINDUCTOR_CACHE_DIR at a folder inside it (e.g. {target / 'inductor'})"
        )
    if info.st_uid != os.getuid():
        return f"{target} belongs to uid {info.st_uid}, not to you"
    reason = not_a_cache_reason(target)
    if reason and not replace_non_cache:
        return (
            f"{target} does not look like a compile cache: {reason}. Nothing was moved "
            "(--replace-non-cache moves it aside anyway, kept as a backup that is never deleted)"
        )
    return None


def restore_snapshot(
    archive: Path,
    targets: dict[str, Path],
    current: BuildFingerprint,
    force: bool = False,
    limits: ReadLimits | None = None,
    restore_id: str | None = None,
    replace_non_cache: bool = False,
    lock_timeout: float = TIMEOUT_S,
) -> RestoreResult:
    """Verify `archive` and swap its folders in at `targets` (root label -> cache folder), all or none.

    Refuses a fingerprint mismatch unless `force`, and a target that is not a compile cache unless
    `replace_non_cache`. On any refusal nothing outside the staging folders is written and they are
    removed. Holds the lock of every target folder throughout.
    """
    with folder_locks(targets.values(), lock_timeout):
        return _restore_locked(archive, targets, current, force, limits, restore_id, replace_non_cache)


def _restore_locked(
    archive: Path,
    targets: dict[str, Path],
    current: BuildFingerprint,
    force: bool,
    limits: ReadLimits | None,
    restore_id: str | None,
    replace_non_cache: bool,
) -> RestoreResult:
    start = time.perf_counter()
    restore_id = restore_id or new_restore_id()
    recovered = [action for target in targets.values() for action in recover_interrupted(target)]
    chosen: dict[str, Path] = {}
    stagings: dict[str, Path] = {}
    reasons: list[str] = []
    not_a_cache: dict[str, bool] = {}
    journal: dict[str, Any] = {}
    journal_at: list[Path] = []

    def prepare(manifest: CacheManifest) -> dict[str, Path]:
        """Between the manifest and the first member: refuse, or make the journal and staging folders."""
        reasons.extend(incompatibilities(manifest.fingerprint, current))
        if reasons and not force:
            raise ArchiveError(
                f"snapshot {printable(manifest.name)!r} was made for another build: {'; '.join(reasons)}",
                hint="a mismatched cache only misses; restore anyway with --force",
            )
        unmapped = sorted(set(manifest.origins) - set(targets))
        if unmapped:
            raise DoctorError(
                f"snapshot {printable(manifest.name)!r} holds a {printable(', '.join(unmapped))} folder "
                "but this environment has no place for it",
                hint="set TRITON_CACHE_DIR to the folder that should receive the Triton cache",
            )
        chosen.update({label: targets[label] for label in manifest.origins})
        for target in chosen.values():
            refusal = target_refusal(target, replace_non_cache)
            if refusal:
                raise DoctorError(refusal, hint="point TORCHINDUCTOR_CACHE_DIR at a compile cache folder")
            not_a_cache[str(target)] = not_a_cache_reason(target) is not None
        _check_room(chosen, manifest)
        first = next(iter(chosen.values()))
        journal.update(
            schema=JOURNAL_SCHEMA,
            restore_id=restore_id,
            uid=os.getuid(),
            created=time.time(),
            phase="extracting",
            roots={
                label: {
                    "target": str(target),
                    "staging": str(staging_path(target, secrets.token_hex(8))),
                    "not_a_cache": not_a_cache[str(target)],
                }
                for label, target in chosen.items()
            },
        )
        for target in chosen.values():
            target.parent.mkdir(parents=True, exist_ok=True)
        _write_journal(journal_path(first), journal)
        journal_at.append(journal_path(first))
        marker = marker_bytes(manifest.fingerprint, str(archive), manifest.name, restore_id)
        for label, root in journal["roots"].items():
            staging = Path(root["staging"])
            staging.mkdir(mode=0o700)  # never an existing folder: FileExistsError if one was planted
            stagings[label] = staging
            write_bytes_atomic(staging / MARKER_NAME, marker)
        return stagings

    try:
        manifest = extract_verified(archive, prepare, limits, on_file=_per_file_hook())
    except BaseException:
        for staging in stagings.values():
            shutil.rmtree(staging, ignore_errors=True)
        for path in journal_at:
            path.unlink(missing_ok=True)
        raise
    result = RestoreResult(manifest, chosen, forced_over=reasons, recovered=recovered)
    journal["phase"] = "swapping"
    _write_journal(journal_at[0], journal)
    for label, staging in stagings.items():
        _pause()
        target = chosen[label]
        backup = _swap(staging, target, restore_id, not_a_cache[str(target)])
        if backup is not None:
            result.backups[label] = backup
    journal_at[0].unlink(missing_ok=True)
    for label, target in chosen.items():
        prune_backups(target, current=result.backups.get(label))
        result.left_alone.extend(strangers(target))
    result.seconds = time.perf_counter() - start
    return result


def _check_room(targets: dict[str, Path], manifest: CacheManifest) -> None:
    need = manifest.total_bytes
    for target in targets.values():
        probe = target.parent
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free = shutil.disk_usage(probe).free
        if free < need * 1.05 + (64 << 20):
            raise DoctorError(
                f"not enough room beside {target}: the snapshot needs {need / 1e6:.0f} MB, {free / 1e6:.0f} MB are free",
                hint="free some space or restore into another TORCHINDUCTOR_CACHE_DIR",
            )
