"""The state of this environment's compile caches, gathered once: what `cache status` prints and
what the `cache.*` checks judge."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from dflash_doctor.cache.fingerprint import BuildFingerprint, incompatibilities
from dflash_doctor.cache.inspection import FolderReport, StartedWalks, inspect_folder, read_mounts
from dflash_doctor.cache.journal import pending_restore
from dflash_doctor.cache.locations import CacheLocations, resolve_locations, snapshots_dir
from dflash_doctor.cache.store import SnapshotInfo, SnapshotStore, folder_distrust


@dataclass(frozen=True)
class Warmth:
    """`warm`, `cold` or `unknown` for the current build, with the reasons when not warm."""

    state: str
    reasons: list[str] = field(default_factory=list)


def warmth_of(folder: FolderReport, current: BuildFingerprint) -> Warmth:
    """Judge from our marker: the Inductor entries themselves are pickles we must not load."""
    if folder.pending:
        return Warmth("cold", [f"{folder.pending}: the next restore or snapshot finishes it"])
    if not folder.exists or not folder.has_entries:
        return Warmth("cold", ["empty" if folder.exists else "missing"])
    made_for = folder.made_for
    if made_for is None:
        return Warmth("unknown", ["no record of the build it was made for"])
    reasons = incompatibilities(made_for, current)
    return Warmth("cold", reasons) if reasons else Warmth("warm")


@dataclass
class CacheStatus:
    locations: CacheLocations
    folders: list[FolderReport]
    current: BuildFingerprint
    snapshots: list[SnapshotInfo]
    store_distrust: str | None = None  # why the store folder itself cannot be trusted

    @property
    def main(self) -> FolderReport:
        return self.folders[0]

    def compatible_snapshots(self) -> list[SnapshotInfo]:
        return [s for s in self.snapshots if not s.incompatible_with(self.current)]

    def to_json(self) -> dict[str, object]:
        warmth = warmth_of(self.main, self.current)
        return {
            "current_build": self.current.to_json(),
            "folders": [f.to_json() for f in self.folders],
            "warmth": {"state": warmth.state, "reasons": warmth.reasons},
            "snapshots_dir": str(snapshots_dir()),
            "store_distrust": self.store_distrust,
            "untrusted_snapshots": [s.name for s in self.snapshots if s.untrusted],
            "compatible_snapshots": [s.name for s in self.compatible_snapshots()],
        }


def start_walks(environ: Mapping[str, str] | None = None) -> StartedWalks:
    """Start walking the cache folders `gather_status` will report (forked children), to overlap other work."""
    locations = resolve_locations(os.environ if environ is None else environ)
    return StartedWalks([locations.inductor, *([locations.triton] if locations.triton is not None else [])])


def gather_status(
    current: BuildFingerprint, environ: Mapping[str, str] | None = None, walks: StartedWalks | None = None
) -> CacheStatus:
    """`walks`: the folders' walks started beside other work (`start_walks`); the rest is read here."""
    locations = resolve_locations(os.environ if environ is None else environ)
    mounts = read_mounts()
    folders = [inspect_folder("inductor", locations.inductor, mounts=mounts, walks=walks)]
    if locations.triton is not None:
        folders.append(inspect_folder("triton", locations.triton, mounts=mounts, walks=walks))
    for folder in folders:  # a journal beside the first root speaks for all of them
        folder.pending = pending_restore(folder.path) or pending_restore(locations.inductor)
    store = SnapshotStore(snapshots_dir())
    return CacheStatus(locations, folders, current, store.snapshots(), folder_distrust(store.root))
