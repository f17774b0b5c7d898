"""Restore a snapshot so that a crash at any moment leaves the old caches or the new ones, whole, all
roots together, and so that nothing planted beside the cache is ever moved in, deleted or written through.

Under the lock of every cache folder it touches (folder_lock.py), whichever home it comes from, and
through a handle of each cache's parent folder, judged first (parent_dir.py: owned by you or root, not
writable by others unless sticky):
1. the roots must not be nested (locations.check_apart); each target must be absent or a folder of ours
   that is a compile cache by its content (swap.judge_target, layout.py); an archive with no files for a
   root whose cache holds some needs `--force`, one with far fewer keeps the replaced cache out of
   retention;
2. an absent target is made (empty, ours) so that no one can plant a link at its name while we work;
   the device and inode of every target are recorded;
3. a journal beside the first target (recovery.py) names this restore's id and, per root, its staging
   folder `.<name>.dflash-staging-<random>` (made with `mkdir`, never an existing one, our marker inside)
   and what the target was;
4. every member is checked and extracted into the staging folders through their handles
   (`/proc/self/fd/<handle>`: whatever the path above them comes to mean), every sha256 verified;
5. the journal moves to phase `swapping`; each root is swapped (swap.py): the new cache in place, the
   previous one, checked by device and inode, kept as `<name>.bak-<id>` with its ownership record;
6. the journal is removed; backups beyond the newest KEEP_BACKUPS of ours go (backups.py). A backup whose
   ownership record found no room (a full disk) does not stop the other roots: the journal then stays,
   and the next run writes the record as it does after a kill (issue 37, B5).
On any refusal or failure before the first root is swapped (the write of phase `swapping` included: a disk
with no inode left for it; issue 37, B5), what this restore made is removed and nothing else was written.
"""

from __future__ import annotations

import errno
import os
import secrets
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_base.errors import DoctorError
from dflash_doctor.cache.backups import (
    KEEP_BACKUPS,
    RecordNotWritten,
    prune_backups,
    strangers,
)
from dflash_doctor.cache.extract import ReadLimits, extract_verified
from dflash_doctor.cache.fingerprint import BuildFingerprint, incompatibilities
from dflash_doctor.cache.folder_lock import TIMEOUT_S, folder_locks
from dflash_doctor.cache.fsops import fd_path, printable, read_only, write_atomic_at
from dflash_doctor.cache.journal import (
    JOURNAL_SCHEMA,
    JOURNAL_SUFFIX,
    STAGING_TAG,
    pending_restore,
    read_journal,
)
from dflash_doctor.cache.layout import examine_listing
from dflash_doctor.cache.locations import check_apart
from dflash_doctor.cache.manifest import MARKER_NAME, ArchiveError, CacheManifest, marker_bytes
from dflash_doctor.cache.parent_dir import ParentDir
from dflash_doctor.cache.recovery import (
    JournalFile,
    recover_interrupted,
    roll_back,
    untouched,
    write_journal,
)
from dflash_doctor.cache.swap import (
    SwapRoot,
    check_shrink,
    is_empty,
    judge_target,
    swap,
)

__all__ = [
    "JOURNAL_SUFFIX",
    "KEEP_BACKUPS",
    "RestoreResult",
    "pending_restore",
    "prune_backups",
    "read_journal",
    "recover_interrupted",
    "restore_snapshot",
]

# Test hook: seconds to sleep after each file and between swap steps, so a test can SIGKILL the
# process at every stage. It only adds sleeps; the code path is the production one.
PAUSE_VARIABLE = "DFLASH_DOCTOR_RESTORE_PAUSE"


@dataclass
class RestoreResult:
    manifest: CacheManifest
    targets: dict[str, Path]
    backups: dict[str, Path] = field(default_factory=dict)
    forced_over: list[str] = field(default_factory=list)  # fingerprint differences accepted by --force
    recovered: list[str] = field(default_factory=list)
    left_alone: list[str] = field(default_factory=list)  # things beside the cache that are not ours
    kept: list[str] = field(default_factory=list)  # backups kept out of retention, and why
    seconds: float = 0.0


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


# -- the restore


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

    Refuses nested targets, a parent others could change, a fingerprint mismatch unless `force`, and a
    target that is not a compile cache unless `replace_non_cache`. On any refusal nothing outside the
    staging folders is written and they are removed. Holds the lock of every target folder throughout.
    """
    check_apart(targets)
    with folder_locks(targets.values(), lock_timeout) as parents:
        restore = _Restore(archive, targets, parents, current, restore_id or new_restore_id())
        return restore.run(force, limits, replace_non_cache)


class _Restore:
    def __init__(
        self,
        archive: Path,
        targets: dict[str, Path],
        parents: dict[Path, ParentDir],
        current: BuildFingerprint,
        restore_id: str,
    ) -> None:
        self.archive, self.targets, self.parents = archive, targets, parents
        self.current, self.restore_id = current, restore_id
        self.roots: list[SwapRoot] = []
        self.staged: list[tuple[SwapRoot, int]] = []  # staging folders made, with their open handles
        self.journal: dict[str, Any] = {}
        self.reasons: list[str] = []
        self.fd_paths: dict[str, str] = {}  # /proc/self/fd/N -> the staging folder's path, for messages

    def run(self, force: bool, limits: ReadLimits | None, replace_non_cache: bool) -> RestoreResult:
        start = time.perf_counter()
        for target, parent in self.parents.items():
            refuse_read_only(target, parent)
        recovered = [
            action
            for target, parent in self.parents.items()
            for action in recover_interrupted(target, parent)
        ]

        def prepare(manifest: CacheManifest) -> dict[str, Path]:
            return self.prepare(manifest, force, replace_non_cache)

        try:
            manifest = extract_verified(self.archive, prepare, limits, on_file=_per_file_hook())
            for root, fd in self.staged:
                check_staged(fd, root, manifest)
        except OSError as exc:
            # a full disk while the journal, a staging folder or its marker was written: a message
            self.undo()
            raise _out_of_room(exc) from None
        except BaseException as exc:
            self.undo()
            if isinstance(exc, DoctorError):
                name_paths(exc, self.fd_paths)
            raise
        finally:
            for _, fd in self.staged:
                os.close(fd)
        result = RestoreResult(manifest, {r.label: r.target for r in self.roots}, forced_over=self.reasons)
        result.recovered = recovered
        first = self.roots[0]
        self.journal["phase"] = "swapping"
        try:
            write_journal(first.parent, first.target, self.journal)
        except OSError as exc:  # no inode left for the journal's new copy (issue 37, B5): nothing swapped yet
            self.undo()
            raise _out_of_room(exc) from None
        unrecorded: dict[Path, str] = {}  # backups whose ownership record found no room, with a line
        for root in self.roots:
            _pause()
            try:
                backup = _swap(root, self.restore_id, lambda: _pause())
            except RecordNotWritten as exc:  # swapped in; only the previous cache's record found no room
                backup = exc.backup
                unrecorded[root.parent.path / backup] = (
                    f"{printable(str(root.parent.path / backup), 4096)}: no space left for its ownership "
                    "record; the next restore or snapshot writes it (until then retention leaves it alone)"
                )
            except OSError as exc:
                self._roll_back(root, exc)
                raise
            if backup is not None:
                result.backups[root.label] = root.parent.path / backup
                if root.kept:
                    result.kept.append(f"{root.parent.path / backup}: kept out of retention ({root.kept})")
        if unrecorded:  # every root swapped, no staging folder left; the journal stays for recovery (B5)
            result.left_alone.extend(unrecorded.values())
        else:
            JournalFile(first.parent, first.target).remove()
        for root in self.roots:
            kept = result.backups.get(root.label)
            prune_backups(root.target, current=kept.name if kept else None, parent=root.parent)
            result.left_alone.extend(
                line
                for line in strangers(root.parent, root.target, STAGING_TAG)
                if not any(line.startswith(f"{path}:") for path in unrecorded)  # said above, not a stranger
            )
        for root in self.roots:
            moved = moved_to(root)
            if moved is not None:
                result.left_alone.append(moved)
        result.seconds = time.perf_counter() - start
        return result

    def prepare(self, manifest: CacheManifest, force: bool, replace_non_cache: bool) -> dict[str, Path]:
        """Between the manifest and the first member: refuse, or make the journal and staging folders."""
        self.reasons.extend(incompatibilities(manifest.fingerprint, self.current))
        if self.reasons and not force:
            raise ArchiveError(
                f"snapshot {printable(manifest.name)!r} was made for another build: {'; '.join(self.reasons)}",
                hint="a mismatched cache only misses; restore anyway with --force",
            )
        unmapped = sorted(set(manifest.origins) - set(self.targets))
        if unmapped:
            raise DoctorError(
                f"snapshot {printable(manifest.name)!r} holds a {printable(', '.join(unmapped))} folder "
                "but this environment has no place for it",
                hint="set TRITON_CACHE_DIR to the folder that should receive the Triton cache",
            )
        for label in manifest.origins:
            target = self.targets[label]
            check_a_cache(label, target, manifest)
            root = SwapRoot(
                label,
                target,
                self.parents[target],
                f".{target.name}{STAGING_TAG}{secrets.token_hex(8)}",
                None,
            )
            content = judge_target(root, replace_non_cache)
            check_shrink(root, content, manifest, force)
            self.roots.append(root)
        _check_room(self.roots, manifest)
        for root in self.roots:
            self._hold_target(root)
        first = self.roots[0]
        self.journal.update(
            schema=JOURNAL_SCHEMA,
            restore_id=self.restore_id,
            uid=os.getuid(),
            created=time.time(),
            phase="extracting",
            roots={root.label: root.to_json() for root in self.roots},
        )
        write_journal(first.parent, first.target, self.journal)
        marker = marker_bytes(manifest.fingerprint, str(self.archive), manifest.name, self.restore_id)
        destinations = {}
        for root in self.roots:
            # never an existing folder: FileExistsError if one was planted
            root.parent.mkdir(root.staging, 0o700)
            fd = root.parent.open_folder(root.staging)
            self.staged.append((root, fd))
            write_atomic_at(fd, MARKER_NAME, marker)
            where = root.parent.path / root.staging
            through = fd_path(fd)  # the writes go through the handle, whatever the path above it means
            if through is None:  # by path, a folder swapped above the staging folder redirects them (A3)
                raise DoctorError(
                    f"cannot write into {where} through its handle: /proc is not mounted here "
                    "(/proc/self/fd), and writing by path could be redirected by whoever can change a folder "
                    "above it; nothing was restored",
                    hint="mount /proc (in a container: do not mask it), then restore again",
                )
            self.fd_paths[through] = str(where)
            destinations[root.label] = Path(through)
        return destinations

    def _hold_target(self, root: SwapRoot) -> None:
        """An absent target is made now, empty and ours, so that no one can plant a name there while we
        work (in /tmp anyone may create any name not taken); its device and inode are recorded."""
        name = root.target.name
        if root.parent.lstat(name) is None:
            try:
                root.parent.mkdir(name, 0o700)
                root.premade = True
            except FileExistsError:  # taken meanwhile: judged like any target
                if judge_target(root, replace_non_cache=False) is None:
                    raise
        root.old = root.parent.identity(name)
        if root.old is None:
            raise DoctorError(f"{root.target} changed while the restore began", hint="try again")

    def _roll_back(self, failed: SwapRoot, exc: OSError) -> None:
        """The swap of `failed` was refused (a mount point: EBUSY) before any root was swapped: the staging
        folders and the journal go, the caches stay (raises the message); otherwise the journal stays for
        the next run, which rolls forward or, as here, back."""
        if not untouched(self.roots, self.restore_id):
            return
        roll_back(self.roots, self.restore_id)
        first = self.roots[0]
        JournalFile(first.parent, first.target).remove()
        raise DoctorError(
            f"cannot swap the restored cache in at {printable(str(failed.target), 4096)} ({exc.strerror}): "
            "nothing was changed, the staging folders were removed",
            hint="if it is a mount point, point TORCHINDUCTOR_CACHE_DIR at a folder inside it",
        ) from None

    def undo(self) -> None:
        """A refusal or a failure before the swap: remove what this restore made, nothing else."""
        for root, _ in self.staged:
            with suppress(OSError):
                root.parent.remove_tree(root.staging)
        for root in self.roots:
            name = root.target.name
            if root.premade and root.parent.identity(name) == root.old and is_empty(root.parent, name):
                os.rmdir(name, dir_fd=root.parent.fd)
        if self.journal:
            first = self.roots[0]
            JournalFile(first.parent, first.target).remove()


def refuse_read_only(target: Path, parent: ParentDir) -> None:
    """A cache whose folder is on a read-only file system is named as such before anything is tried (it
    used to fail on the lock, with a hint to remove a lock that could not exist; issue 37, B6/B7)."""
    if read_only(parent.fd):
        raise DoctorError(
            f"{printable(str(target), 4096)} is on a read-only file system ({printable(str(parent.path), 4096)} "
            "is mounted read-only): a restore writes beside the cache and swaps it in; nothing was written",
            hint="point TORCHINDUCTOR_CACHE_DIR (and TRITON_CACHE_DIR) at a folder on a writable disk; "
            "a read-only cache can still be snapshotted",
        )


def _out_of_room(exc: OSError) -> OSError | DoctorError:
    """A write that failed before the swap, once `undo` removed what this restore made: a full disk (or
    quota) as a message; any other error as it came (the CLI names its file)."""
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return exc
    where = printable(str(exc.filename or "beside the cache"))
    return DoctorError(
        f"no space left on the device while writing {where}: nothing was swapped in, the staging "
        "folders were removed",
        hint="free some space (or inodes: df -i), then restore again",
    )


def moved_to(root: SwapRoot) -> str | None:
    """A line when the cache's folder was renamed while the restore ran (the restore went on through its
    handle): where the cache is now, so the path printed is not taken for it (issue 37, P1)."""
    try:
        now = os.readlink(f"/proc/self/fd/{root.parent.fd}")
    except OSError:
        return None
    if now == os.path.realpath(root.parent.path):
        return None
    if now.endswith(" (deleted)"):
        return f"{printable(str(root.target))}: its folder was removed while the restore ran"
    return (
        f"{printable(str(root.parent.path))} was renamed while the restore ran: the restored cache is now "
        f"{printable(os.path.join(now, root.target.name), 4096)}, not {printable(str(root.target), 4096)}"
    )


def name_paths(error: DoctorError, fd_paths: Mapping[str, str]) -> None:
    """Say the folders' paths in `error`, not the /proc paths of the handles the work went through."""
    for through, where in fd_paths.items():
        error.message = error.message.replace(through, where)
    error.args = (error.message if error.hint is None else f"{error.message}\n  hint: {error.hint}",)


def staged_files(fd: int) -> dict[str, int]:
    """Path -> size of every file under the open staging folder `fd` (our marker left out), walked
    through handles without recursion."""
    found: dict[str, int] = {}
    pending: list[tuple[int, str]] = [(os.dup(fd), "")]
    while pending:
        folder, where = pending.pop()
        try:
            with os.scandir(folder) as entries:
                listed = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
            for name, is_dir in listed:
                path = f"{where}{name}"
                if is_dir:
                    pending.append(
                        (
                            os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=folder),
                            path + "/",
                        )
                    )
                elif path != MARKER_NAME:
                    found[path] = os.stat(name, dir_fd=folder, follow_symlinks=False).st_size
        finally:
            os.close(folder)
    return found


def check_staged(fd: int, root: SwapRoot, manifest: CacheManifest) -> None:
    """Just before the swap: the staging folder holds exactly the files the manifest lists for this root,
    of the listed sizes, so "every sha256 verified" is said of what goes live (issue 37, G3: a staging
    folder emptied by another process mid-extraction was swapped in with 708 of 800 files)."""
    prefix = f"{root.label}/"
    listed = {e.path[len(prefix) :]: e.size for e in manifest.files if e.path.startswith(prefix)}
    found = staged_files(fd)
    if found != listed:
        missing = sorted(set(listed) - set(found))
        changed = sorted(p for p in set(listed) & set(found) if listed[p] != found[p])
        extra = sorted(set(found) - set(listed))
        facts = [f"{len(found)} files where the archive has {len(listed)}"]
        for what, paths in (("missing", missing), ("resized", changed), ("not in the archive", extra)):
            if paths:
                facts.append(f"{what}: {printable(', '.join(paths[:3]), 300)}")
        raise DoctorError(
            f"the staging folder no longer holds what was verified ({'; '.join(facts)}): another process "
            f"changed it; nothing was swapped in, {root.target} is unchanged",
            hint="make sure no other dflash-doctor (another home, another user) restores into this cache, "
            "then restore again",
        )


def check_a_cache(label: str, target: Path, manifest: CacheManifest) -> None:
    """Before a byte is written: what the manifest lists for this root must make a compile cache by the content
    rule every later restore judges its target by (layout.py), or that restore would refuse it, and every one
    after it (issue 58, H3: an archive of look-alike names left a cache no restore would replace). The staged
    tree is checked against the manifest at the swap (`check_staged`), so the listing stands for it."""
    prefix = f"{label}/"
    reason = examine_listing(
        e.path[len(prefix) :] for e in manifest.files if e.path.startswith(prefix)
    ).reason
    if reason is not None:
        raise ArchiveError(
            f"snapshot {printable(manifest.name)!r}: its {label} files would not make a compile cache "
            f"({printable(reason, 400)}): every later restore would refuse that folder; nothing was written, "
            f"{printable(str(target), 4096)} is unchanged",
            hint="restore a snapshot dflash-doctor made (`cache snapshot` archives only a compile cache)",
        )


def _megabytes(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def _check_room(roots: list[SwapRoot], manifest: CacheManifest) -> None:
    """Room for the snapshot and a margin in proportion to it (a fixed 64 MiB refused every restore into a
    64 MiB /dev/shm; issue 37, B3): a tenth more, plus a block per file for folders and rounding."""
    need = manifest.total_bytes
    wanted = int(need * 1.1) + 4096 * (len(manifest.files) + 16)
    for root in roots:
        free = root.parent.free_bytes()
        if free < wanted:
            raise DoctorError(
                f"not enough room beside {root.target}: the snapshot needs {_megabytes(wanted)} "
                f"({_megabytes(need)} of files and a margin), {_megabytes(free)} are free",
                hint="free some space or restore into another TORCHINDUCTOR_CACHE_DIR",
            )


_swap = swap  # the step a test kills between two roots (tests/cache/test_attacks.py, D7)
