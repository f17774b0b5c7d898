"""The cache folder a launch compiles into (or loads from), judged at the moment it is used.

The gate's `cache.*` checks judge the folder before the launch, but the launch uses it later: a restore, a
warm-up child, the workers. In a shared parent (sticky, as /tmp) another user can create the folder in that
window; a launch that then compiled cold there (the fallback when a restore is refused) or took it as warm had
its warm-up child and workers import that user's code, as root (issue 58, TR1). So right before the first
process compiles, every cache root is claimed: its parent opened and judged by handle, every folder of its
path as given (parent_dir.py), the folder made (0700, ours) when absent, else opened without following a link
and judged on that handle: a folder of yours or root's that no one else can write. Once claimed nothing above
or in it can be changed by another user (they can neither rename our folder in a sticky parent nor write into
it), so the path the processes are given leads to the folder judged. Anything else stops the launch, naming it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from dflash_base.errors import DoctorError
from dflash_doctor.cache.fsops import kind_of, printable
from dflash_doctor.cache.locations import ROOT_VARIABLES
from dflash_doctor.cache.parent_dir import ParentDir, parent_remedy


def claim_cache_folders(roots: Mapping[str, Path]) -> None:
    """Make or judge every cache root (label -> folder) a compile is about to use; a DoctorError naming the
    first one another user made or can change, before any process is started into it."""
    for label, folder in roots.items():
        claim_folder(folder, ROOT_VARIABLES.get(label, label))


def claim_folder(folder: Path, variable: str) -> None:
    with ParentDir.open(folder.parent) as parent:
        name = folder.name
        if parent.lstat(name) is None:
            with contextlib.suppress(FileExistsError):  # taken meanwhile: judged below like any folder there
                parent.mkdir(name, 0o700)
        try:
            fd = parent.open_folder(name)
        except OSError:
            info = parent.lstat(name)
            what = kind_of(info.st_mode) if info is not None else "nothing"
            raise DoctorError(
                f"the compile cache {printable(str(folder), 4096)} is a {what}, not a folder: a launch "
                "compiles into a folder of its own",
                hint=parent_remedy(),
            ) from None
        try:
            info = os.fstat(fd)
        finally:
            os.close(fd)
    why = None
    if info.st_uid not in (0, os.getuid()):
        why = f"belongs to uid {info.st_uid}: another user made it (perhaps after the checks ran)"
    elif stat.S_IMODE(info.st_mode) & (stat.S_IWGRP | stat.S_IWOTH):
        why = f"is writable by others (mode {stat.S_IMODE(info.st_mode):04o})"
    if why is not None:
        raise DoctorError(
            f"the compile cache {printable(str(folder), 4096)} ({variable}) {why}: the warm-up and the workers "
            "would load code from it as you; nothing was compiled or started",
            hint=parent_remedy(),
        )
