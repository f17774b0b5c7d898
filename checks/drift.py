"""drift.*: what changed since the known-good lock (`check --lock FILE`, or ./dflash.lock).

Each change between the lock and this environment becomes one finding `drift.<kind>` (e.g.
`drift.torch.commit`, `drift.library.hash`), with the old and new value as evidence.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from typing import TYPE_CHECKING

from dflash_base.errors import DoctorError
from dflash_doctor.context import CheckContext
from dflash_doctor.findings import Finding, Severity, fail, ok, skip, warn
from dflash_doctor.registry import check

if TYPE_CHECKING:  # the lock machinery is imported when a lock is compared, not by every `check`
    from dflash_doctor.lock.drift import Change
    from dflash_doctor.lock.lockfile import EnvironmentLock


@check("drift.lock", "drift from the lock", requires=["lock"])
def lock_drift(ctx: CheckContext) -> Iterator[Finding]:
    from dflash_doctor.lock.drift import diff_locks
    from dflash_doctor.lock.lockfile import current_lock, read_lock

    path = ctx.options.lock_path
    assert path is not None  # guaranteed by requires=["lock"]
    try:
        locked = read_lock(path)
    except DoctorError as exc:
        yield fail(
            "drift.unreadable", exc.message, remedy=f"dflash-doctor lock --out {shlex.quote(str(path))}"
        )
        return
    now = current_lock(ctx)
    changes = diff_locks(locked, now)
    python = ctx.env.interpreter.executable
    for change in changes:
        yield change_finding(change, locked, python, str(path))
    if locked.libraries is None or now.libraries is None:
        note = locked.libraries_note if locked.libraries is None else now.libraries_note
        yield skip("drift.libraries", f"library hashes not compared: {note}", lock=str(path))
    if not changes:
        yield ok(
            "drift.lock",
            f"matches {path} ({len(now.distributions)} distributions, "
            f"{len(now.libraries or {})} libraries, locked {locked.created or 'at an unknown time'})",
            lock=str(path),
        )


def change_finding(change: Change, locked: EnvironmentLock, python: str, lock_path: str) -> Finding:
    evidence = {"kind": change.kind, "subject": change.subject, "locked": change.before, "now": change.after}
    if change.note:
        evidence["note"] = change.note
    relock = f"dflash-doctor lock --out {shlex.quote(lock_path)}  # only if this change is intended"
    remedy = _restore_command(change, locked, python) or relock
    summary = f"{change.kind}: {change.summary}"
    if change.severity is Severity.FAIL:
        return fail(f"drift.{change.kind}", summary, remedy=remedy, **evidence)
    return warn(f"drift.{change.kind}", summary, remedy=remedy, **evidence)


def _restore_command(change: Change, locked: EnvironmentLock, python: str) -> str | None:
    """How to get the locked build back, where one package explains the change."""
    package: str | None = None
    if change.kind.startswith("package.") and change.kind != "package.added":
        package = change.subject
    elif change.kind.startswith("torch."):
        package = "torch"
    elif change.kind.startswith("library.") and locked.libraries:
        owners = (locked.libraries.get(change.subject) or {}).get("owners") or []
        package = owners[0] if owners else None
    row = locked.distributions.get(package or "")
    if package is None or row is None:
        return None
    return f"{shlex.quote(python)} -m pip install --force-reinstall --no-deps {shlex.quote(row['name'] + '==' + row['version'])}"
