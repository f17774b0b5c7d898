"""Restore a snapshot of the store and adopt the warm-up records it carries: one home, one policy.

`cache restore` and `train`'s restore of a cold cache did this each in its own way, with opposite handling of
records that could not be kept (a warning in one, a failed launch in the other; issue 55). Here: the restore
itself is verified and swapped in under the store's lock, or refused (a DoctorError the caller decides about:
`cache restore` exits 2, `train` compiles cold); once it is in, records that cannot be kept are a warning line,
never a failure (the cache is restored; only a later warm-up may run that a record would have skipped). A
forced restore adopts none: it is for another build, its records could never match here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dflash_base.errors import DoctorError
from dflash_doctor.cache.fingerprint import BuildFingerprint
from dflash_doctor.cache.restore import RestoreResult, restore_snapshot
from dflash_doctor.cache.store import SnapshotStore
from dflash_doctor.cache.warm_record import WarmRecords, default_records


@dataclass
class StoreRestore:
    archive: Path
    result: RestoreResult
    adopted: int  # warm-up records the snapshot carried, now this home's
    warnings: list[str] = field(default_factory=list)  # things left alone beside the cache; records not kept


def restore_from_store(
    store: SnapshotStore,
    snapshot: str,
    roots: Mapping[str, Path],
    current: BuildFingerprint,
    force: bool = False,
    replace_non_cache: bool = False,
    records: WarmRecords | None = None,
) -> StoreRestore:
    """Verify and swap in `snapshot` (a name in the store or a path), then adopt its warm-up records."""
    with store.locked():
        archive = store.resolve(snapshot)
        result = restore_snapshot(
            archive, dict(roots), current, force=force, replace_non_cache=replace_non_cache
        )
    restored = StoreRestore(archive, result, 0, list(result.left_alone))
    if result.forced_over:
        return restored
    try:
        restored.adopted = (records or default_records()).adopt(
            result.manifest.warm_records, result.manifest.name
        )
    except DoctorError as exc:  # the cache is restored; only its records could not be kept
        restored.warnings.append(f"the snapshot's warm-up records were not kept: {exc.message}")
    return restored
