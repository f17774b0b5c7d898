"""Issue 58: the cache store's fourth round. One test (or more) per row, named by the row, each failing on the
code before its fix; a real second user (uid 65534), or a folder chown-ed to it, where the row needs one,
skipped with the reason where the tests cannot change uid or owner."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dflash_base.errors import DoctorError
from dflash_doctor.cache.parent_dir import untrusted_folder
from dflash_doctor.cache.snapshot import take_snapshot
from tests.cache.helpers import CPU_BUILD, make_tree
from tests.cache.second_user import OTHER_USER
from tests.cache.test_attacks import restore_into, snapshot_of
from tests.cache.test_hostile import disk_state

ROOT = os.getuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="making another user's folder needs root (chown)")


# -- A1: a folder that holds a link on the way to the cache, judged as given (not only the real path)


@needs_root
def test_a1_a_link_in_another_users_folder_is_refused_before_the_restore(tmp_path: Path) -> None:
    """Another user owns /x/att and replaced its `p` with a link to a folder of root's before the restore:
    the real path is all root's, but whoever owns `att` can point `p` anywhere at any moment."""
    archive, _ = snapshot_of(tmp_path)
    rooted = tmp_path / "roots-own"
    rooted.mkdir()
    att = tmp_path / "att"
    att.mkdir()
    (att / "p").symlink_to(rooted)
    os.chown(att, OTHER_USER, OTHER_USER)
    before = disk_state(rooted)
    with pytest.raises(DoctorError, match=f"{att} belongs to uid {OTHER_USER}"):
        restore_into(archive, att / "p" / "inductor")
    with pytest.raises(DoctorError, match=f"{att} belongs to uid {OTHER_USER}"):
        take_snapshot({"inductor": att / "p" / "inductor"}, CPU_BUILD, "s", tmp_path / "s.tar.zst")
    assert disk_state(rooted) == before == {}  # nothing written through the link: no cache, no lock
    assert untrusted_folder(att / "p") == (att, f"belongs to uid {OTHER_USER}")


def test_a1_a_link_in_a_folder_others_can_write_is_refused(tmp_path: Path) -> None:
    """The same without root: the folder holding the link is writable by others without the sticky bit."""
    archive, _ = snapshot_of(tmp_path)
    real = tmp_path / "real"
    real.mkdir()
    exposed = tmp_path / "exposed"
    exposed.mkdir()
    (exposed / "p").symlink_to(real)
    exposed.chmod(0o777)
    with pytest.raises(DoctorError, match=f"{exposed} is a folder others can write"):
        restore_into(archive, exposed / "p" / "inductor")
    assert disk_state(real) == {}


@needs_root
def test_a1_another_users_link_in_a_sticky_folder_is_refused(tmp_path: Path) -> None:
    """In a sticky shared folder (as /tmp) a link of another user's can be repointed by its owner at will."""
    archive, _ = snapshot_of(tmp_path)
    real = tmp_path / "real"
    real.mkdir()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    link = shared / "p"
    link.symlink_to(real)
    os.lchown(link, OTHER_USER, OTHER_USER)
    with pytest.raises(DoctorError, match=f"symbolic link of uid {OTHER_USER}"):
        restore_into(archive, link / "inductor")
    assert disk_state(real) == {}


def test_a1_links_of_yours_on_the_way_still_work(tmp_path: Path) -> None:
    """A path through links in trusted folders (relative, absolute, with `..`) restores where it leads."""
    archive, digests = snapshot_of(tmp_path)
    real = tmp_path / "a" / "b"
    real.mkdir(parents=True)
    (tmp_path / "rel").symlink_to("a/b/../b")
    (tmp_path / "abs").symlink_to(real)
    restore_into(archive, tmp_path / "rel" / "inductor")
    assert (real / "inductor").is_dir()
    make_tree(tmp_path / "unused", files=1)
    restore_into(archive, tmp_path / "abs" / "inductor", force=True)
    assert len(list((real / "inductor").rglob("*"))) >= len(digests)
