"""cache.*: the Inductor/Triton compile cache: where it lives, who can write it, warm for this build.

It holds code that gets loaded and executed, so a cache others can write to is a failure, not a
warning. A cold cache means every worker compiles flex_attention at once on the first launch (the
story's crash), so a compatible snapshot is worth restoring before a launch.
"""

from __future__ import annotations

import os
import shlex
import stat
from collections.abc import Iterator

from dflash_base.errors import DoctorError
from dflash_doctor.audit.cache import cache_status, start_cache_walks
from dflash_doctor.cache.inspection import SAMPLE, FolderReport, volatility
from dflash_doctor.cache.locations import INDUCTOR_VARIABLE, check_apart, managed_inductor_dir, snapshots_dir
from dflash_doctor.cache.parent_dir import lock_folder_remedy, untrusted_folder
from dflash_doctor.cache.status import warmth_of
from dflash_doctor.context import CheckContext
from dflash_doctor.findings import Finding, fail, ok, skip, warn
from dflash_doctor.paths import HOME_ENV, cache_root, lock_root
from dflash_doctor.registry import check


def persistent_cache_remedy() -> str:
    """Point the cache at our managed folder, unless that folder is volatile too (DFLASH_DOCTOR_HOME set to a
    temp folder): then the home has to move, or the advice would swap one volatile folder for another."""
    managed = managed_inductor_dir()
    if volatility(managed, None) is None:
        return f"export {INDUCTOR_VARIABLE}={managed}  # persistent, private; then `dflash-doctor cache warm`"
    return (
        f"export {HOME_ENV}=<a folder of yours outside the temp folders>  # the managed cache {managed} is "
        f"volatile too; then `export {INDUCTOR_VARIABLE}=${HOME_ENV}/cache/inductor` and `dflash-doctor cache warm`"
    )


@check("cache.location", "compile cache", starts=start_cache_walks)
def cache_location(ctx: CheckContext) -> Iterator[Finding]:
    status = cache_status(ctx)
    try:
        check_apart(status.locations.roots())
    except DoctorError as exc:  # restore, snapshot and warm refuse these roots: say so before they run
        yield fail("cache.nested_roots", exc.message, remedy=exc.hint)
    for folder in status.folders:
        facts = {"path": str(folder.path), "filesystem": folder.fs_type or "unknown", "exists": folder.exists}
        if folder.exists:
            facts.update(size_mb=round(folder.size_bytes / 1e6, 1), files=folder.files)
        if folder.volatile:
            yield warn(
                "cache.volatile",
                f"{folder.label} cache {folder.path} is {folder.volatile}: a cleanup or reboot makes every launch compile cold",
                remedy=persistent_cache_remedy(),
                **facts,
            )
        else:
            yield ok("cache.location", f"{folder.label} cache at {folder.path}", **facts)


def _parent_findings(folder: FolderReport) -> Iterator[Finding]:
    """The folder that holds the cache: whoever can write it can rename the cache or plant names beside it."""
    parent = folder.path.parent
    mode = f"{folder.parent_mode:04o}" if folder.parent_mode is not None else "unknown"
    if folder.untrusted_above is not None:  # every folder up to `/` is judged, not the parent alone
        above, why = folder.untrusted_above
        yield fail(
            "cache.parent_writable",
            f"the folder {above} above the {folder.label} cache {why}: its owner can swap the folders below "
            "it for links to a cache of their own, which torch loads as you",
            remedy=f"export {INDUCTOR_VARIABLE}={managed_inductor_dir()}  # a cache in a folder only you own",
            parent=str(above),
        )
    elif folder.parent_exposure == "open":
        yield fail(
            "cache.parent_writable",
            f"the {folder.label} cache's folder {parent} (mode {mode}, uid {folder.parent_uid}) lets others "
            "rename or replace the cache itself: code in it gets loaded and executed",
            remedy=f"export {INDUCTOR_VARIABLE}={managed_inductor_dir()}  # a cache in a folder only you own",
            parent=str(parent),
        )
    elif folder.parent_exposure == "shared":
        yield warn(
            "cache.parent_shared",
            f"the {folder.label} cache sits in {parent} (mode {mode}), where every user can create names: "
            "one can take the cache's path before you, or plant files beside it",
            remedy=f"export {INDUCTOR_VARIABLE}={managed_inductor_dir()}  # a cache in a folder only you own",
            parent=str(parent),
        )


@check("cache.permissions", "compile cache", starts=start_cache_walks)
def cache_permissions(ctx: CheckContext) -> Iterator[Finding]:
    status = cache_status(ctx)
    for folder in status.folders:
        yield from _parent_findings(folder)
        if not folder.exists:
            yield skip("cache.permissions", f"{folder.label} cache {folder.path} does not exist yet")
            continue
        clean = True
        if folder.foreign_count:
            clean = False
            yield fail(
                "cache.foreign_owner",
                f"{folder.foreign_count} entr{'y' if folder.foreign_count == 1 else 'ies'} of the {folder.label} cache "
                f"{folder.path} belong to another user: code in it gets loaded and executed",
                remedy=f"export {INDUCTOR_VARIABLE}={managed_inductor_dir()}  # a cache only you own",
                examples=folder.foreign_owned,
            )
        if folder.unsafe_count:
            clean = False
            yield fail(
                "cache.writable_by_others",
                f"{folder.unsafe_count} entr{'y' if folder.unsafe_count == 1 else 'ies'} of the {folder.label} cache "
                f"{folder.path} are group- or world-writable: anyone could plant code that gets executed",
                remedy=f"chmod -R go-w {folder.path}",
                examples=folder.unsafe_writable,
            )
        if clean:
            yield ok(
                "cache.permissions",
                f"{folder.label} cache owned by you, not writable by others",
                mode=f"{folder.mode:04o}" if folder.mode is not None else "unknown",
            )


def home_findings() -> Iterator[Finding]:
    """Our home's cache folder holds the store and the managed cache: others who can write it can swap
    either away (issue 37, I1: under umask 000 it used to be made 0777)."""
    root = cache_root()
    for folder in (root.parent, root) if os.environ.get(HOME_ENV) else (root,):
        try:
            info = os.lstat(folder)
        except OSError:
            continue
        mode = stat.S_IMODE(info.st_mode)
        if stat.S_ISDIR(info.st_mode) and mode & (stat.S_IWGRP | stat.S_IWOTH):
            yield warn(
                "cache.home_writable",
                f"{folder} (mode {mode:04o}) is writable by others: they can swap the snapshot store or the "
                "managed cache in it for their own",
                remedy=f"chmod 700 {shlex.quote(str(folder))}",
                path=str(folder),
            )


def lock_folder_findings() -> Iterator[Finding]:
    """This user's lock folder (the same for every home) is judged like a cache's parent before any restore,
    snapshot or warm-up takes a lock in it: a folder others can write on its way refuses them all, and `train`
    compiles cold at every launch (issue 58, L2: a group-writable ~/.cache under umask 002). Said here first."""
    root = lock_root()
    found = untrusted_folder(root)
    if found is not None:
        where, why = found
        yield warn(
            "cache.lock_folder",
            f"the folder {where} on the way to your lock folder {root} {why}: every `cache restore`, `snapshot` "
            "and `warm` refuses to take its lock there, and `train` compiles cold at every launch",
            remedy=lock_folder_remedy(where),
            path=str(where),
        )


@check("cache.store", "compile cache", starts=start_cache_walks)
def cache_store(ctx: CheckContext) -> Iterator[Finding]:
    """The snapshot store holds code a restore installs: it must be yours and private, like the cache."""
    yield from home_findings()
    yield from lock_folder_findings()
    status = cache_status(ctx)
    store = snapshots_dir()
    if status.store_distrust:
        yield fail(
            "cache.store_permissions",
            f"{status.store_distrust}: another user could put an archive there that a restore installs as yours",
            remedy=f"chmod go-w {store}",
        )
    untrusted = [s for s in status.snapshots if s.untrusted and not status.store_distrust]
    if untrusted:
        yield fail(
            "cache.store_untrusted",
            f"{len(untrusted)} archive(s) in {store} are not yours or are writable by others; "
            "they are never restored by name",
            remedy="rm -i -- " + " ".join(shlex.quote(str(s.path)) for s in untrusted[:SAMPLE]),
            examples=[f"{s.path}: {s.untrusted}" for s in untrusted[:SAMPLE]],
        )
    if not status.store_distrust and not untrusted:
        if store.is_dir():
            yield ok(
                "cache.store",
                f"snapshot store {store}: {len(status.snapshots)} archive(s), yours and private",
            )
        else:
            yield skip("cache.store", f"no snapshot store yet at {store}")


@check("cache.warm", "compile cache", starts=start_cache_walks)
def cache_warm(ctx: CheckContext) -> Iterator[Finding]:
    status = cache_status(ctx)
    folder = status.main
    warmth = warmth_of(folder, status.current)
    compatible = status.compatible_snapshots()
    build = status.current.describe()
    if warmth.state == "warm":
        yield ok("cache.warm", f"warm for this build ({build})", path=str(folder.path), files=folder.files)
    elif warmth.state == "cold" and compatible:
        name = compatible[0].name
        yield warn(
            "cache.cold",
            f"cache {folder.path} is cold for this build ({'; '.join(warmth.reasons)}), "
            f"and snapshot {name} is compatible",
            remedy=f"dflash-doctor cache restore {name}",
            build=build,
            compatible_snapshots=[s.name for s in compatible],
        )
    elif warmth.state == "cold" and folder.has_entries:
        yield warn(
            "cache.cold",
            f"cache {folder.path} was made for another build ({'; '.join(warmth.reasons)}): the first launch compiles cold",
            remedy="dflash-doctor cache warm  # compile once, in one process, before launching workers",
            build=build,
        )
    elif warmth.state == "cold":
        yield skip(
            "cache.empty",
            f"no compile cache yet at {folder.path} (`dflash-doctor cache warm` compiles once before a launch)",
        )
    else:
        yield ok(
            "cache.present",
            f"{folder.files} cached files; the build they were made for is not recorded",
            path=str(folder.path),
            snapshots=[s.name for s in compatible],
        )
