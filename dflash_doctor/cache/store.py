"""The snapshot store: a folder of `<name>.tar.zst` archives, one lock, list and prune.

Every operation that writes to the store takes the store's lock, so a snapshot, a restore and a prune
of one home never interleave, across processes too (a POSIX `flock`, opened as folder_lock.py opens a
cache folder's lock: no link followed, nothing truncated); each cache folder has its own lock besides,
for commands from other homes.

The archives hold code that a restore installs: an archive is trusted only when it is a regular file
of this user (or root) in a store folder no one else can write. Another user's archive, or any archive
in a folder others can write, is listed as untrusted, never recommended and never restored by name.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dflash_base.atomic import write_json_atomic
from dflash_base.errors import DoctorError
from dflash_doctor.cache.fingerprint import BuildFingerprint, incompatibilities
from dflash_doctor.cache.folder_lock import lock_file as held_lock_file
from dflash_doctor.cache.fsops import printable, read_only, read_owned
from dflash_doctor.cache.manifest import ARCHIVE_SUFFIX, PARTIAL_TAG, ArchiveError, CacheManifest
from dflash_doctor.paths import HOME_ENV, check_folder_path, make_private_dirs

LOCK_NAME = ".store.lock"
ORDER_NAME = ".store-order.json"  # the order the store wrote its archives in (C1)
ORDER_SCHEMA = "dflash-doctor/store-order/v1"
FUTURE_SLACK_S = 300.0  # a creation time this far past the clock now was made by a clock running ahead
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True)
class SnapshotInfo:
    """One archive in the store, with its manifest (None when the archive is unreadable)."""

    name: str
    path: Path
    size_bytes: int
    manifest: CacheManifest | None
    error: str | None = None
    mtime: float = 0.0
    untrusted: str | None = None  # why this archive must not be restored by name
    owner_uid: int | None = None
    damaged: bool = False  # refused as an archive (truncated, corrupt, hostile): `error` says why
    sequence: int | None = None  # its place in the order the store wrote its archives (`record`; C1)

    @property
    def remedy(self) -> str | None:
        """What to do about a damaged archive: it can never be restored, so remove it (a copy cut
        short is copied again from where it came from)."""
        if not self.damaged:
            return None
        return (
            f"rm -- {shlex.quote(str(self.path))}  "
            "# then copy it again from its source, or take a new one: dflash-doctor cache snapshot"
        )

    @property
    def ours(self) -> bool:
        """A regular file of this user: what `cache prune` may delete (never another user's)."""
        return self.owner_uid == os.getuid()

    @property
    def created(self) -> float:
        return self.manifest.created if self.manifest else self.mtime

    @property
    def from_the_future(self) -> bool:
        """Made with a clock running ahead: its creation time is past the clock now."""
        return self.created > time.time() + FUTURE_SLACK_S

    @property
    def order(self) -> tuple[int, float, float]:
        """Its place among the store's archives, oldest first, by what the store itself recorded: the order it
        wrote them in (`SnapshotStore.record`), after every archive it did not write (copied in, or written
        before the store kept an order), those by creation time, one created in the future counted oldest (a
        snapshot made with the clock ten years ahead was "newest" for ten years: `status` recommended it,
        `train` restored it, `prune --keep 1` deleted the real newest; issue 58, C1)."""
        created = float("-inf") if self.from_the_future else self.created
        if self.sequence is not None:
            return 1, float(self.sequence), created
        return 0, created, 0.0

    def incompatible_with(self, current: BuildFingerprint) -> list[str]:
        if self.untrusted is not None:
            return [f"untrusted: {self.untrusted}"]
        if self.manifest is None:
            return [f"{'damaged' if self.damaged else 'unreadable'}: {self.error}"]
        return incompatibilities(self.manifest.fingerprint, current)


def _trusted_owner(uid: int) -> bool:
    return uid in (os.getuid(), 0)


def folder_distrust(folder: Path) -> str | None:
    """Why archives in `folder` cannot be trusted (None: they can): another user's folder, or one that
    others can write (they could replace any archive in it)."""
    try:
        info = os.lstat(folder)
    except OSError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return f"the store {folder} is a symbolic link"
    if not _trusted_owner(info.st_uid):
        return f"the store {folder} belongs to uid {info.st_uid}"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"the store {folder} is writable by others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def archive_distrust(info: os.stat_result) -> str | None:
    """Why one archive cannot be trusted (None: it can)."""
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if not _trusted_owner(info.st_uid):
        return f"it belongs to uid {info.st_uid}"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"it is writable by others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def check_name(name: str) -> str:
    if not _NAME.match(name) or name.endswith(ARCHIVE_SUFFIX):
        raise DoctorError(
            f"snapshot name {name!r} is not usable",
            hint="use letters, digits, '.', '_', '+', '-' (up to 128), without the .tar.zst suffix",
        )
    return name


def default_name(fingerprint: BuildFingerprint, now: float) -> str:
    """`torch2.11.0+cu130-h200-20261130-001036`: what it is for and when, readable in `cache list`."""
    gpu = fingerprint.gpu_names[0] if fingerprint.gpu_names else "cpu"
    gpu = re.sub(r"[^a-z0-9]+", "", gpu.lower().replace("nvidia", "")) or "gpu"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    version = re.sub(r"[^A-Za-z0-9.+]", "", fingerprint.torch_version or "notorch")
    return f"torch{version}-{gpu}-{stamp}"


def parse_duration(text: str) -> float:
    """`7d`, `12h`, `30m`, `2w`, `90s` -> seconds."""
    match = _DURATION.match(text.strip().lower())
    if not match:
        raise DoctorError(
            f"duration {text!r} is not understood", hint="use a number and a unit: 90s, 30m, 12h, 7d, 2w"
        )
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def choose_prunable(
    snapshots: list[SnapshotInfo], keep: int | None, older_than: float | None, now: float
) -> list[SnapshotInfo]:
    """Which snapshots to delete: beyond the newest `keep`, and/or created more than `older_than` ago.

    With both given, a snapshot goes only when both say so (keep protects the newest N regardless). Newest by
    the store's own order (`SnapshotInfo.order`), not by a clock that may have been wrong.
    """
    if keep is None and older_than is None:
        return []
    newest_first = sorted(snapshots, key=lambda s: s.order, reverse=True)
    doomed = []
    for rank, snap in enumerate(newest_first):
        beyond_keep = keep is None or rank >= keep
        too_old = older_than is None or now - min(snap.created, now) > older_than  # the future: age unknown
        if beyond_keep and too_old:
            doomed.append(snap)
    return doomed


class SnapshotStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def check_usable(self) -> None:
        """A DoctorError when the store's path runs into a file (a home or `cache/snapshots` that is a
        file): a reader would otherwise say "no snapshots" of a store it cannot see. A store that is a
        symbolic link is refused with the fix: archives would be written through it, then all of them
        judged by a folder the link names (issue 37, J1)."""
        if os.path.islink(self.root):
            raise DoctorError(
                f"the snapshot store {self.root} is a symbolic link (to {os.readlink(self.root)}): it must be "
                "a folder of yours",
                hint=f"rm {self.root} && mkdir -m 700 {self.root} (then move your archives in), or set "
                f"{HOME_ENV} to another folder",
            )
        check_folder_path(self.root, "the snapshot store")

    def ensure(self) -> None:
        """Make the store folder (private), or say plainly why it cannot be."""
        self.check_usable()
        try:
            make_private_dirs(self.root)
        except FileExistsError:
            raise DoctorError(
                f"the snapshot store {self.root} (or a folder above it) is a file, not a folder",
                hint=f"move it away, or set {HOME_ENV} to another folder",
            ) from None
        except NotADirectoryError:
            raise DoctorError(
                f"a part of the snapshot store's path {self.root} is a file, not a folder",
                hint=f"move it away, or set {HOME_ENV} to another folder",
            ) from None
        except PermissionError:
            raise DoctorError(
                f"cannot create the snapshot store {self.root}: permission denied",
                hint=f"set {HOME_ENV} to a folder you can write",
            ) from None
        if not self.root.is_dir():
            raise DoctorError(f"the snapshot store {self.root} is not a folder", hint="move it away")
        distrust = folder_distrust(self.root)
        if distrust is not None:  # another user's store, made before ours could be (issue 58, P7)
            raise DoctorError(
                f"{distrust}: its owner (or anyone who can write it) could replace an archive written there, which "
                "a restore would install as yours; nothing was written",
                hint=f"set {HOME_ENV} to a folder of yours, or remove {self.root} if you did not make it "
                f"(`chmod go-w {self.root}` if it is yours)",
            )

    def read_only(self) -> bool:
        """The store is on a read-only file system (prebuilt snapshots on a shared read-only mount)."""
        return self.root.is_dir() and read_only(self.root)

    def check_writable(self, what: str) -> None:
        """A DoctorError naming a read-only store before `what` tries to change it (issue 37, B7)."""
        if self.read_only():
            raise DoctorError(
                f"the snapshot store {self.root} is on a read-only file system: {what} cannot change it; "
                "nothing was changed",
                hint=f"set {HOME_ENV} to a folder on a writable disk for a store of your own "
                "(a read-only store still serves `cache list` and `cache restore`)",
            )

    @contextmanager
    def locked(self, timeout: float = 600.0) -> Iterator[None]:
        """Hold the store lock (opened like a cache folder's lock: folder_lock.py); a clear error, not a
        hang, when another operation holds it too long. A store on a read-only file system is read without
        it: the lock cannot be created there, and nothing can change the store through that mount (B7)."""
        self.ensure()
        if self.read_only():
            yield
            return
        lock_file = self.root / LOCK_NAME
        busy = DoctorError(
            f"another dflash-doctor cache operation holds {lock_file}",
            hint="wait for it to finish, then try again",
        )
        hint = f"remove {lock_file} if you did not make it, or set {HOME_ENV} to a folder of yours"
        with held_lock_file(lock_file, "the store lock", timeout, busy, hint):
            yield

    def _recorded_order(self) -> dict[str, int]:
        """Archive name -> its place in the order this store wrote them (`record`); {} when none was kept."""
        raw = read_owned(self.root / ORDER_NAME)
        try:
            data = json.loads(raw) if raw is not None else None
        except (UnicodeDecodeError, ValueError, RecursionError):
            return {}
        order = data.get("order") if isinstance(data, dict) and data.get("schema") == ORDER_SCHEMA else None
        if not isinstance(order, dict):
            return {}
        return {k: v for k, v in order.items() if isinstance(k, str) and type(v) is int}

    def record(self, archive: Path) -> None:
        """Note that the store has just written `archive`: the newest, whatever its creation time says. The
        caller holds the store's lock. An archive written elsewhere (`--out`) is not the store's."""
        if archive.parent != self.root or self.read_only():
            return
        order = self._recorded_order()
        present = {p.name[: -len(ARCHIVE_SUFFIX)] for p in self.root.glob(f"*{ARCHIVE_SUFFIX}")}
        kept = {name: place for name, place in order.items() if name in present}
        kept[archive.name[: -len(ARCHIVE_SUFFIX)]] = max(order.values(), default=0) + 1
        write_json_atomic(self.root / ORDER_NAME, {"schema": ORDER_SCHEMA, "order": kept})

    def path_for(self, name: str) -> Path:
        return self.root / f"{check_name(name)}{ARCHIVE_SUFFIX}"

    def resolve(self, name_or_path: str) -> Path:
        """A snapshot name in the store, or a path to an archive anywhere."""
        candidate = Path(name_or_path).expanduser()
        if name_or_path.endswith(ARCHIVE_SUFFIX) or os.sep in name_or_path:
            if not candidate.is_file():
                raise DoctorError(f"{name_or_path}: no such archive")
            if Path(os.path.realpath(candidate)).parent == Path(os.path.realpath(self.root)):
                self._check_trusted(
                    candidate.name, os.lstat(candidate)
                )  # in the store: the store's rule (K1)
            return candidate
        path = self.path_for(name_or_path)
        try:
            info = os.lstat(path)
        except OSError:
            raise DoctorError(
                f"no snapshot named {name_or_path!r} in {self.root}", hint="see `dflash-doctor cache list`"
            ) from None
        self._check_trusted(name_or_path, info)
        return path

    def _check_trusted(self, name: str, info: os.stat_result) -> None:
        """The rule of `cache list`: an archive of yours (or root's), not writable by others, in a store
        only you can write; else a DoctorError naming why."""
        distrust = folder_distrust(self.root) or archive_distrust(info)
        if distrust:
            raise DoctorError(
                f"snapshot {name!r} is not trusted: {distrust}; its code would run as yours",
                hint=f"chmod go-w {self.root} and remove archives you did not make; "
                "an archive you trust can be restored by its path from outside the store",
            )

    def snapshots(self) -> list[SnapshotInfo]:
        """Every archive in the store, newest first (`SnapshotInfo.order`); damaged or unreadable ones are listed
        with their error."""
        if not self.root.is_dir():
            return []
        from dflash_doctor.cache.extract import (
            read_manifest,
        )  # only for a listing (zstandard, tar): not on import

        found = []
        store_distrust = folder_distrust(self.root)
        order = self._recorded_order()
        for path in self.root.glob(f"*{ARCHIVE_SUFFIX}"):
            if path.name.startswith("."):
                continue  # a partial write in progress or left by a crash
            name = printable(path.name[: -len(ARCHIVE_SUFFIX)])
            try:
                info = os.lstat(path)
            except OSError as exc:
                found.append(SnapshotInfo(name, path, 0, None, str(exc)))
                continue
            untrusted = store_distrust or archive_distrust(info)
            damaged = False
            try:
                manifest, error = read_manifest(path), None
            except DoctorError as exc:  # ArchiveError, or a link/FIFO/device refused unopened
                manifest, error, damaged = None, exc.message, isinstance(exc, ArchiveError)
            except OSError as exc:
                manifest, error = None, str(exc)
            owner = info.st_uid if stat.S_ISREG(info.st_mode) else None
            sequence = order.get(path.name[: -len(ARCHIVE_SUFFIX)])
            found.append(
                SnapshotInfo(
                    name,
                    path,
                    info.st_size,
                    manifest,
                    error,
                    info.st_mtime,
                    untrusted,
                    owner,
                    damaged,
                    sequence,
                )
            )
        return sorted(found, key=lambda s: s.order, reverse=True)

    def compatible(self, current: BuildFingerprint) -> list[SnapshotInfo]:
        return [s for s in self.snapshots() if not s.incompatible_with(current)]

    def remove_partials(self) -> list[Path]:
        """Archives a crashed snapshot left half-written (never visible under their final name)."""
        removed: list[Path] = []
        if self.read_only():
            return removed
        for path in self.root.glob(f".*{ARCHIVE_SUFFIX}{PARTIAL_TAG}*"):
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid():  # only ours
                path.unlink(missing_ok=True)
                removed.append(path)
        return removed
