"""A real small file system for disk-full tests: a tmpfs of a few hundred kB mounted under tmp_path.

Mounting needs root (or CAP_SYS_ADMIN); where it is not permitted the tests that need it are skipped.
Every mount is undone when the test ends."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """`small_disk(kb)`: a fresh tmpfs of `kb` kB (whole pages), returned as an empty folder on it."""
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted: list[Path] = []

    def mount(kb: int) -> Path:
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={kb}k", "tmpfs", str(folder)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in reversed(mounted):
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def fill(folder: Path, leave: int) -> None:
    """Fill `folder`'s file system until about `leave` bytes are free."""
    free = shutil.disk_usage(folder).free
    if free > leave:
        (folder / "filler").write_bytes(b"\0" * (free - leave))
