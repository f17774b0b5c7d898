"""Restore a snapshot so that a crash at any moment leaves the old cache or the new one, whole.

Steps, per cache folder (`target`):
1. a staging folder beside the target (same filesystem): `.<name>.dflash-staging-<id>`; our marker
   file goes in first, naming this restore's id;
2. every member is checked and extracted into it, every sha256 verified (extract.extract_verified);
   the manifest is read once, at the head of the same pass: the fingerprint, the room and the
   folders are settled between it and the first member;
3. one atomic `renameat2(RENAME_EXCHANGE)` swaps staging and target: the target is now the new
   cache and the staging name holds the old one, which is then renamed to `<name>.bak-<id>`.
   Where the filesystem cannot exchange, two renames (target -> backup, staging -> target).
A run that finds leftovers finishes the job (`recover_interrupted`): a staging folder whose id the
target's marker carries is the old cache after the exchange (-> the backup); any other staging folder
is an unfinished extraction (-> deleted); a target missing between the two fallback renames gets its
backup back.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dflash_doctor.cache.extract import ReadLimits, extract_verified
from dflash_doctor.cache.fingerprint import BuildFingerprint, incompatibilities
from dflash_doctor.cache.manifest import MARKER_NAME, ArchiveError, CacheManifest, marker_bytes, read_marker
from dflash_doctor.errors import DoctorError

STAGING_TAG = ".dflash-staging-"
BACKUP_TAG = ".bak-"
# Test hook: seconds to sleep after each file and between swap steps, so a test can SIGKILL the
# process at every stage. It only adds sleeps; the code path is the production one.
PAUSE_VARIABLE = "DFLASH_DOCTOR_RESTORE_PAUSE"

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


@dataclass
class RestoreResult:
    manifest: CacheManifest
    targets: dict[str, Path]
    backups: dict[str, Path] = field(default_factory=dict)
    forced_over: list[str] = field(default_factory=list)  # fingerprint differences accepted by --force
    recovered: list[str] = field(default_factory=list)
    seconds: float = 0.0


def staging_path(target: Path, restore_id: str) -> Path:
    return target.parent / f".{target.name}{STAGING_TAG}{restore_id}"


def backup_path(target: Path, restore_id: str) -> Path:
    return target.parent / f"{target.name}{BACKUP_TAG}{restore_id}"


def new_restore_id(now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
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


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE). False when unsupported here."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: this filesystem or kernel cannot exchange
        return False
    raise OSError(err, os.strerror(err), str(a))


def _marker_id(folder: Path) -> str | None:
    try:
        marker = read_marker((folder / MARKER_NAME).read_bytes())
    except OSError:
        return None
    restore_id = marker.get("restore_id") if marker else None
    return restore_id if isinstance(restore_id, str) else None


def swap_in(staging: Path, target: Path, restore_id: str) -> Path | None:
    """Put the verified staging folder at `target`; return where the previous cache went."""
    if not os.path.lexists(target):
        os.rename(staging, target)
        return None
    if not target.is_dir():
        raise DoctorError(f"{target} exists and is not a folder", hint="move it away, then restore again")
    backup = backup_path(target, restore_id)
    if exchange(staging, target):
        _pause()
        os.rename(staging, backup)
    else:
        os.rename(target, backup)
        _pause()
        os.rename(staging, target)
    return backup


KEEP_BACKUPS = 2  # a 350 MB cache restored daily must not fill the disk with old copies


def prune_backups(target: Path, keep: int = KEEP_BACKUPS) -> list[Path]:
    """Delete all but the newest `keep` backups beside `target` (names sort by their restore time)."""
    backups = sorted(target.parent.glob(f"{target.name}{BACKUP_TAG}*"), key=lambda p: p.name, reverse=True)
    doomed = [b for b in backups[keep:] if b.is_dir() and not b.is_symlink()]
    for backup in doomed:
        shutil.rmtree(backup, ignore_errors=True)
    return doomed


def recover_interrupted(target: Path) -> list[str]:
    """Finish or undo what a killed restore left beside `target`; say what was done."""
    actions: list[str] = []
    parent, prefix = target.parent, f".{target.name}{STAGING_TAG}"
    if not parent.is_dir():
        return actions
    for staging in sorted(parent.glob(f"{prefix}*")):
        restore_id = staging.name[len(prefix) :]
        backup = backup_path(target, restore_id)
        if not os.path.lexists(target) and backup.is_dir():
            os.rename(backup, target)  # killed between the two fallback renames: the old cache returns
            actions.append(f"put the previous cache back from {backup}")
        if _marker_id(target) == restore_id and not os.path.lexists(backup):
            os.rename(staging, backup)  # killed after the exchange: staging holds the old cache
            actions.append(f"kept the previous cache as {backup}")
        else:
            shutil.rmtree(staging, ignore_errors=True)
            actions.append(f"removed an unfinished staging folder {staging}")
    return actions


def restore_snapshot(
    archive: Path,
    targets: dict[str, Path],
    current: BuildFingerprint,
    force: bool = False,
    limits: ReadLimits | None = None,
    restore_id: str | None = None,
) -> RestoreResult:
    """Verify `archive` and swap its folders in at `targets` (root label -> cache folder).

    Refuses a fingerprint mismatch unless `force`. On any refusal nothing outside the staging
    folders is written and the staging folders are removed.
    """
    start = time.perf_counter()
    restore_id = restore_id or new_restore_id()
    recovered = [action for target in targets.values() for action in recover_interrupted(target)]
    chosen: dict[str, Path] = {}
    stagings: dict[str, Path] = {}
    reasons: list[str] = []

    def prepare(manifest: CacheManifest) -> dict[str, Path]:
        """Between the manifest and the first member: refuse, or make the staging folders."""
        reasons.extend(incompatibilities(manifest.fingerprint, current))
        if reasons and not force:
            raise ArchiveError(
                f"snapshot {manifest.name!r} was made for another build: {'; '.join(reasons)}",
                hint="a mismatched cache only misses; restore anyway with --force",
            )
        unmapped = sorted(set(manifest.origins) - set(targets))
        if unmapped:
            raise DoctorError(
                f"snapshot {manifest.name!r} holds a {', '.join(unmapped)} folder but this environment has no place for it",
                hint="set TRITON_CACHE_DIR to the folder that should receive the Triton cache",
            )
        chosen.update({label: targets[label] for label in manifest.origins})
        _check_room(chosen, manifest)
        marker = marker_bytes(manifest.fingerprint, str(archive), manifest.name, restore_id)
        for label, target in chosen.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            staging = staging_path(target, restore_id)
            staging.mkdir(mode=0o755)
            stagings[label] = staging
            (staging / MARKER_NAME).write_bytes(marker)
        return stagings

    try:
        manifest = extract_verified(archive, prepare, limits, on_file=_per_file_hook())
    except BaseException:
        for staging in stagings.values():
            shutil.rmtree(staging, ignore_errors=True)
        raise
    result = RestoreResult(manifest, chosen, forced_over=reasons, recovered=recovered)
    for label, staging in stagings.items():
        _pause()
        backup = swap_in(staging, chosen[label], restore_id)
        if backup is not None:
            result.backups[label] = backup
            prune_backups(chosen[label])
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
