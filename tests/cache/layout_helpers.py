"""What only the cache tests do to a cache folder: examine one by path, plant a build marker in one. The product
examines an open folder (`layout.examine`, inside its locks) and writes the marker with the snapshot."""

from __future__ import annotations

import os
from pathlib import Path

from dflash_base.atomic import write_bytes_atomic
from dflash_doctor.cache.fingerprint import BuildFingerprint
from dflash_doctor.cache.layout import CacheContent, examine
from dflash_doctor.cache.manifest import MARKER_NAME, marker_bytes


def examine_path(path: str | os.PathLike[str]) -> CacheContent | None:
    """`examine` of the folder at `path` (opened without following a link); None when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return examine(fd)
    finally:
        os.close(fd)


def write_marker(folder: Path, fingerprint: BuildFingerprint, origin: str, snapshot: str | None) -> None:
    """Record in the cache folder which build it holds (atomically: beside, then rename)."""
    write_bytes_atomic(folder / MARKER_NAME, marker_bytes(fingerprint, origin, snapshot, None))
