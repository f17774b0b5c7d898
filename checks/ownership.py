"""File ownership: files two distributions claim, files whose bytes changed, files a RECORD lists and are gone.

This is what broke the seed's run: `nvidia-nccl-cu12` and `nvidia-nccl-cu13` both install
`nvidia/nccl/lib/libnccl.so.2`; the second overwrites the first (torch then dies with
`undefined symbol: ncclCommResume`), and uninstalling either deletes the file the other still lists.
`pip check` sees none of it, and a plain reinstall answers "already installed".
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterator

from dflash_doctor.audit.packages import (
    cuda_families,
    record_audit,
    removable,
    requirement_graph,
    resolved_library_paths,
    start_ownership_survey,
    torch_closure,
    twin_remedy,
    wanted_pin,
)
from dflash_doctor.context import CheckContext
from dflash_doctor.env.pip_commands import reinstall_command
from dflash_doctor.env.record_audit import SharedFile, is_shared_library
from dflash_doctor.findings import Finding, fail, ok, warn
from dflash_doctor.registry import check

SHOWN = 8  # files listed in evidence; the count says how many in all


@check("ownership.twins", "no file claimed by two distributions", starts=start_ownership_survey)
def twins_check(ctx: CheckContext) -> Iterator[Finding]:
    audit = record_audit(ctx)
    groups: dict[tuple[str, ...], list[SharedFile]] = defaultdict(list)
    for shared in audit.shared:
        groups[shared.owners].append(shared)
    for owners, files in sorted(groups.items()):
        wanted = _wanted_owner(ctx, owners, files)
        strays = [o for o in owners if o != wanted]
        _, kept = removable(ctx, strays)
        versions = {o: ctx.env.distributions[o].version for o in owners}
        facts: dict[str, object] = {
            "owners": versions,
            "files": len(files),
            "bytes_on_disk_match": {_short(ctx, f.path): _verdict(f) for f in files[:SHOWN]},
            "keep": wanted,
        }
        if kept:
            facts["not_uninstalled_because_required_by"] = kept
        if all(f.same_content and f.present for f in files):
            yield from _identical(ctx, owners, files, wanted, strays, facts)
            continue
        clobbered = [f for f in files if f.present and wanted not in f.matches]
        missing = [f for f in files if not f.present]
        detail = (
            f"{len(clobbered)} hold another owner's bytes"
            if clobbered
            else f"{len(missing)} are gone"
            if missing
            else "the bytes are still the right ones, for now"
        )
        yield fail(
            "ownership.twins",
            f"{' and '.join(owners)} install the same {len(files)} file(s) ({detail}); torch needs {wanted}",
            remedy=_twin_remedy(ctx, strays, wanted, bytes_wrong=bool(clobbered or missing)),
            **facts,
        )
    if not groups:
        yield ok(
            "ownership.twins",
            f"no file is claimed by two distributions ({audit.files_checked} files checked; "
            "empty namespace `__init__.py` files may be)",
        )


def _identical(
    ctx: CheckContext,
    owners: tuple[str, ...],
    files: list[SharedFile],
    wanted: str,
    strays: list[str],
    facts: dict[str, object],
) -> Iterator[Finding]:
    """Same bytes from every owner: nothing is wrong until one owner is uninstalled. Worth a warning
    only for a shared library (that uninstall would take a library the other owner loads)."""
    summary = (
        f"{' and '.join(owners)} install the same {len(files)} file(s) with identical bytes; "
        "uninstalling one deletes them from the other"
    )
    if any(is_shared_library(f.path) for f in files):
        yield warn(
            "ownership.twins.identical",
            summary,
            remedy=_twin_remedy(ctx, strays, wanted, bytes_wrong=False),
            **facts,
        )
    else:
        yield ok("ownership.twins.identical", summary + " (information: nothing to do now)", **facts)


def _twin_remedy(ctx: CheckContext, strays: list[str], wanted: str, bytes_wrong: bool) -> str | None:
    """Uninstall the strays nothing requires, then put the wanted owner's files back; with no stray to
    take, only a reinstall, and only when the bytes on disk are wrong."""
    gone, _ = removable(ctx, strays)
    if gone:
        return twin_remedy(ctx, gone, [wanted])
    return twin_remedy(ctx, [], [wanted]) if bytes_wrong else None


def load_bearing(ctx: CheckContext, key: str, paths: list[str]) -> bool:
    """A change fails when it can break training: a package torch needs (its requirement closure) or
    a file the loader simulation says `import torch` maps. Elsewhere it is information (shown under
    `-v`): images patch data files on purpose (a corporate CA appended to certifi's cacert.pem)."""
    if key in torch_closure(ctx):
        return True
    loaded = resolved_library_paths(ctx)
    return any(os.path.normpath(p) in loaded for p in paths)


def _record_finding(
    ctx: CheckContext,
    check_id: str,
    key: str,
    paths: list[str],
    summary: str,
    breaks_its_import: bool = False,
    **facts: object,
) -> Finding:
    """One distribution whose files differ from or are missing against its RECORD, judged by consequence:
    fail where torch loads it; a warning where the package's own import breaks (`breaks_its_import`: its
    code or a library of it is gone); information (ok, shown under `-v`) elsewhere; never a pip remedy
    for a package a system package manager owns."""
    dist = ctx.env.distributions[key]
    managed = dist.managed_by
    facts["dist_info"] = dist.dist_info
    if managed is not None:
        facts["managed_by"] = managed
        return ok(check_id, f"{summary} (information: managed by {managed}, not pip)", **facts)
    remedy = reinstall_command(ctx.env, wanted_pin(ctx, key))
    if load_bearing(ctx, key, paths):
        return fail(check_id, summary, remedy=remedy, **facts)
    if breaks_its_import:
        return warn(check_id, f"{summary}: importing {dist.name} fails", remedy=remedy, **facts)
    facts["reinstall"] = remedy
    return ok(check_id, f"{summary} (information: torch does not load {dist.name})", **facts)


@check("ownership.clobbered", "installed files match their RECORD", starts=start_ownership_survey)
def clobbered_check(ctx: CheckContext) -> Iterator[Finding]:
    audit = record_audit(ctx)
    for key, changed in sorted(audit.changed.items()):
        dist = ctx.env.distributions[key]
        yield _record_finding(
            ctx,
            "ownership.clobbered",
            key,
            [c.path for c in changed],
            f"{dist.name} {dist.version}: {len(changed)} file(s) no longer match its RECORD",
            files={_short(ctx, c.path): c.how for c in changed[:SHOWN]},
            count=len(changed),
        )
    if not audit.changed:
        yield ok(
            "ownership.clobbered",
            f"{audit.files_checked} files match their RECORD sizes; "
            f"{audit.files_hashed + audit.cache_hits} of them (libraries, shared files) their sha256 too",
            **audit.timing(),
        )


@check("ownership.missing_files", "no file listed in a RECORD is gone", starts=start_ownership_survey)
def missing_files_check(ctx: CheckContext) -> Iterator[Finding]:
    audit = record_audit(ctx)
    closure = torch_closure(ctx)
    for key, gone in sorted(audit.missing.items()):
        dist = ctx.env.distributions[key]
        needed = " (torch needs it)" if key in closure else ""
        yield _record_finding(
            ctx,
            "ownership.missing_files",
            key,
            gone,
            f"{dist.name} {dist.version}{needed}: {len(gone)} file(s) its RECORD lists are gone "
            "(a plain reinstall says 'already installed')",
            breaks_its_import=_importable_code_gone(dist.site_dir, gone),
            files=[_short(ctx, p) for p in gone[:SHOWN]],
            count=len(gone),
        )
    if not audit.missing:
        facts: dict[str, object] = {}
        if audit.namespace_missing:
            facts["empty_init_files_gone"] = [_short(ctx, p) for p in audit.namespace_missing[:SHOWN]]
        yield ok(
            "ownership.missing_files",
            f"every file the RECORDs list is present ({audit.files_checked})"
            + (
                f"; {len(audit.namespace_missing)} empty `__init__.py` gone (harmless: a namespace package)"
                if audit.namespace_missing
                else ""
            ),
            **facts,
        )


def _importable_code_gone(site_dir: str, gone: list[str]) -> bool:
    """A module or library inside the site folder is gone (a script in `bin/` is not imported)."""
    inside = site_dir.rstrip(os.sep) + os.sep
    return any(p.startswith(inside) and (p.endswith(".py") or is_shared_library(p)) for p in gone)


def _wanted_owner(ctx: CheckContext, owners: tuple[str, ...], files: list[SharedFile]) -> str:
    """Which twin to keep: the one torch needs, else one anything needs, else torch's CUDA family,
    else the one whose bytes are on disk now (the one installed last)."""
    closure = torch_closure(ctx)
    for candidates in (
        [o for o in owners if o in closure],
        [o for o in owners if requirement_graph(ctx).required_by(o)],
        _same_family_as_torch(ctx, owners),
    ):
        if len(candidates) == 1:
            return candidates[0]
    on_disk = [o for o in owners if any(o in f.matches for f in files)]
    return on_disk[0] if len(on_disk) == 1 else owners[0]


def _same_family_as_torch(ctx: CheckContext, owners: tuple[str, ...]) -> list[str]:
    build = ctx.env.torch
    if build is None or build.cuda_major is None:
        return []
    families = cuda_families(ctx)
    return [o for o in owners if o in families and families[o].major == build.cuda_major]


def _verdict(shared: SharedFile) -> str:
    if not shared.present:
        return "missing"
    return ", ".join(shared.matches) if shared.matches else "neither owner's RECORD"


def _short(ctx: CheckContext, path: str) -> str:
    """A path relative to its site folder: what a person recognises (`nvidia/nccl/lib/libnccl.so.2`)."""
    for site_dir in ctx.env.interpreter.site_dirs:
        prefix = site_dir.rstrip(os.sep) + os.sep
        if path.startswith(prefix):
            return path[len(prefix) :]
    return path
