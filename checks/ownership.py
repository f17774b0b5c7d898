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
    requirement_graph,
    torch_closure,
    twin_remedy,
)
from dflash_doctor.context import CheckContext
from dflash_doctor.env.pip_commands import pip_command
from dflash_doctor.env.record_audit import SharedFile, is_shared_library
from dflash_doctor.findings import Finding, fail, ok, warn
from dflash_doctor.registry import check

SHOWN = 8  # files listed in evidence; the count says how many in all


@check("ownership.twins", "no file claimed by two distributions")
def twins_check(ctx: CheckContext) -> Iterator[Finding]:
    audit = record_audit(ctx)
    groups: dict[tuple[str, ...], list[SharedFile]] = defaultdict(list)
    for shared in audit.shared:
        groups[shared.owners].append(shared)
    for owners, files in sorted(groups.items()):
        wanted = _wanted_owner(ctx, owners, files)
        strays = [o for o in owners if o != wanted]
        versions = {o: ctx.env.distributions[o].version for o in owners}
        facts = {
            "owners": versions,
            "files": len(files),
            "bytes_on_disk_match": {_short(ctx, f.path): _verdict(f) for f in files[:SHOWN]},
            "keep": wanted,
        }
        remedy = twin_remedy(ctx, strays, [wanted])
        if all(f.same_content and f.present for f in files):
            yield warn(
                "ownership.twins.identical",
                f"{' and '.join(owners)} install the same {len(files)} file(s) with identical bytes; "
                "uninstalling one deletes them from the other",
                remedy=remedy,
                **facts,
            )
            continue
        clobbered = [f for f in files if f.present and wanted not in f.matches]
        detail = (
            f"{len(clobbered)} hold another owner's bytes"
            if clobbered
            else "the bytes are still the right ones, for now"
        )
        yield fail(
            "ownership.twins",
            f"{' and '.join(owners)} install the same {len(files)} file(s) ({detail}); torch needs {wanted}",
            remedy=remedy,
            **facts,
        )
    if not groups:
        yield ok(
            "ownership.twins",
            f"no file is claimed by two distributions ({audit.files_checked} files checked)",
        )


def load_bearing(ctx: CheckContext, key: str, paths: list[str]) -> bool:
    """A change fails when it can break training: a package torch needs (its requirement closure) or
    a shared library anyone loads. Elsewhere it warns: images often patch data files on purpose
    (a corporate CA appended to certifi's cacert.pem), and `pip install --target` leaves scripts
    where RECORD does not point."""
    return key in torch_closure(ctx) or any(is_shared_library(p) for p in paths)


@check("ownership.clobbered", "installed files match their RECORD")
def clobbered_check(ctx: CheckContext) -> Iterator[Finding]:
    audit = record_audit(ctx)
    for key, changed in sorted(audit.changed.items()):
        dist = ctx.env.distributions[key]
        verdict = fail if load_bearing(ctx, key, [c.path for c in changed]) else warn
        yield verdict(
            "ownership.clobbered",
            f"{dist.name} {dist.version}: {len(changed)} file(s) no longer match its RECORD",
            remedy=pip_command(ctx.env, "install", "--force-reinstall", f"{dist.name}=={dist.version}"),
            files={_short(ctx, c.path): c.how for c in changed[:SHOWN]},
            count=len(changed),
            dist_info=dist.dist_info,
        )
    if not audit.changed:
        yield ok(
            "ownership.clobbered",
            f"{audit.files_checked} files match their RECORD sizes; "
            f"{audit.files_hashed + audit.cache_hits} of them (libraries, shared files) their sha256 too",
            **audit.timing(),
        )


@check("ownership.missing_files", "no file listed in a RECORD is gone")
def missing_files_check(ctx: CheckContext) -> Iterator[Finding]:
    audit = record_audit(ctx)
    closure = torch_closure(ctx)
    for key, gone in sorted(audit.missing.items()):
        dist = ctx.env.distributions[key]
        needed = " (torch needs it)" if key in closure else ""
        verdict = fail if load_bearing(ctx, key, gone) else warn
        yield verdict(
            "ownership.missing_files",
            f"{dist.name} {dist.version}{needed}: {len(gone)} file(s) its RECORD lists are gone "
            "(a plain reinstall says 'already installed')",
            remedy=pip_command(ctx.env, "install", "--force-reinstall", f"{dist.name}=={dist.version}"),
            files=[_short(ctx, p) for p in gone[:SHOWN]],
            count=len(gone),
            dist_info=dist.dist_info,
        )
    if not audit.missing:
        yield ok("ownership.missing_files", f"every file the RECORDs list is present ({audit.files_checked})")


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
