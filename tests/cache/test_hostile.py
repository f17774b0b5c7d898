"""Hostile archives: each is refused with a clear message, nothing is written outside staging, and
the existing cache is untouched."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from dflash_doctor.cache.archive import ReadLimits
from dflash_doctor.cache.folder_lock import LOCK_SUFFIX
from dflash_doctor.cache.manifest import ArchiveError
from dflash_doctor.cache.restore import restore_snapshot
from dflash_doctor.cache.snapshot import take_snapshot
from tests.cache.helpers import (
    CPU_BUILD,
    inductor_key,
    make_tree,
    manifest_for,
    tree_digests,
    write_raw_archive,
)

_KEY = inductor_key("good")
GOOD_PATH = (
    f"inductor/{_KEY[:2]}/c{_KEY}.py"  # named as Inductor names its code: what a restore may put live (H3)
)
GOOD = {GOOD_PATH: b"print('cached kernel')\n" * 50}
_OTHER = inductor_key("other")
OTHER_PATH = (
    f"inductor/{_OTHER[:2]}/c{_OTHER}.so"  # a second compiler-named file (planted, or listed and gone)
)


def disk_state(root: Path) -> dict[str, str]:
    """Every path under root with a digest of its content (or its type): to prove nothing else changed."""
    state = {}
    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            if name.endswith(LOCK_SUFFIX):
                continue  # a cache folder's lock stays beside it (folder_lock.py), empty
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            if path.is_symlink() or not path.is_file():
                state[rel] = "dir" if path.is_dir() else "other"
            else:
                state[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return state


def special(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


def _members(extra: list) -> list:
    return [(path, data) for path, data in GOOD.items()] + extra


CASES: dict[str, tuple[Callable[[Path], tuple[object, list]], str]] = {
    "absolute path": (
        lambda t: (manifest_for(GOOD), _members([(str(t / "evil.py"), b"x")])),
        "absolute path",
    ),
    "dotdot": (lambda t: (manifest_for(GOOD), _members([("inductor/../../evil.py", b"x")])), "`..`"),
    "symlink escape": (
        lambda t: (
            manifest_for(GOOD),
            _members([special("inductor/ab/link", tarfile.SYMTYPE, "../../../evil")]),
        ),
        "points outside the cache tree",
    ),
    "absolute symlink": (
        lambda t: (manifest_for(GOOD), _members([special("inductor/link", tarfile.SYMTYPE, "/etc/passwd")])),
        "points outside the cache tree",
    ),
    "hardlink escape": (
        lambda t: (
            manifest_for(GOOD),
            _members([special("inductor/hard", tarfile.LNKTYPE, "../outside.py")]),
        ),
        "points outside the cache tree",
    ),
    "device": (
        lambda t: (manifest_for(GOOD), _members([special("inductor/dev", tarfile.CHRTYPE)])),
        "device file",
    ),
    "fifo": (lambda t: (manifest_for(GOOD), _members([special("inductor/pipe", tarfile.FIFOTYPE)])), "fifo"),
    "member not in manifest": (
        lambda t: (manifest_for(GOOD), _members([(OTHER_PATH, b"planted")])),
        "not in the manifest",
    ),
    "manifest lists a missing file": (
        lambda t: (manifest_for({**GOOD, OTHER_PATH: b"gone"}), _members([])),
        "does not hold",
    ),
    "size differs from manifest": (
        lambda t: (manifest_for({GOOD_PATH: b"short"}), _members([])),
        "the manifest does not match the members",
    ),
    "wrong sha256": (
        lambda t: (
            manifest_for({GOOD_PATH: b"P" * len(GOOD[GOOD_PATH])}),
            _members([]),
        ),
        "does not match the manifest",
    ),
    "wrong fingerprint": (
        lambda t: (
            manifest_for(GOOD, dataclasses.replace(CPU_BUILD, torch_version="2.11.0+cu130", cuda="13.0")),
            _members([]),
        ),
        "made for another build",
    ),
    "no manifest first": (lambda t: (None, _members([])), "first member is not MANIFEST.json"),
    "manifest not json": (lambda t: (b"{not json", _members([])), "not valid JSON"),
    "root outside the manifest": (
        lambda t: (manifest_for(GOOD), _members([("elsewhere/x.py", b"x")])),
        "outside",
    ),
}


@pytest.fixture
def victim(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    target = tmp_path / "caches" / "inductor"
    return target, make_tree(target, files=12, seed=7)


def assert_refused(
    tmp_path: Path,
    archive: Path,
    target: Path,
    before_cache: dict[str, str],
    expect: str,
    limits: ReadLimits | None = None,
) -> None:
    before = disk_state(tmp_path)
    with pytest.raises(ArchiveError) as refused:
        restore_snapshot(archive, {"inductor": target}, CPU_BUILD, limits=limits)
    assert expect in refused.value.message
    assert tree_digests(target) == before_cache  # the existing cache is untouched
    assert disk_state(tmp_path) == before  # nothing written anywhere, staging removed
    assert not (tmp_path / "evil.py").exists() and not (tmp_path / "outside.py").exists()


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_archive_is_refused(case: str, tmp_path: Path, victim: tuple[Path, dict[str, str]]) -> None:
    target, before_cache = victim
    build, expect = CASES[case]
    manifest, members = build(tmp_path)
    archive = write_raw_archive(tmp_path / "hostile.tar.zst", manifest, members)  # type: ignore[arg-type]
    assert_refused(tmp_path, archive, target, before_cache, expect)


def test_oversized_member_is_refused(tmp_path: Path, victim: tuple[Path, dict[str, str]]) -> None:
    target, before_cache = victim
    big = {"inductor/ab/cbig.so": b"\0" * 5000}
    archive = write_raw_archive(tmp_path / "big.tar.zst", manifest_for(big), list(big.items()))
    assert_refused(tmp_path, archive, target, before_cache, "oversized", ReadLimits(max_member_bytes=4096))


def test_truncated_archive_is_refused(tmp_path: Path, victim: tuple[Path, dict[str, str]]) -> None:
    target, before_cache = victim
    source = tmp_path / "source"
    make_tree(source, files=60, seed=3, size=40_000)
    good = take_snapshot({"inductor": source}, CPU_BUILD, "good", tmp_path / "good.tar.zst").path
    data = good.read_bytes()
    for fraction in (0.3, 0.7, 0.99):
        cut = tmp_path / f"cut-{fraction}.tar.zst"
        cut.write_bytes(data[: int(len(data) * fraction)])
        assert_refused(tmp_path, cut, target, before_cache, "truncated")


def test_wrong_fingerprint_restores_with_force(tmp_path: Path, victim: tuple[Path, dict[str, str]]) -> None:
    target, _ = victim
    other = dataclasses.replace(CPU_BUILD, torch_git="0" * 40)
    archive = write_raw_archive(tmp_path / "other.tar.zst", manifest_for(GOOD, other), _members([]))
    result = restore_snapshot(archive, {"inductor": target}, CPU_BUILD, force=True)
    assert result.forced_over and "git commit" in result.forced_over[0]
    assert tree_digests(target) == {GOOD_PATH.partition("/")[2]: hashlib.sha256(GOOD[GOOD_PATH]).hexdigest()}
