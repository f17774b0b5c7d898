"""Issue 30: the cache store's second attack round. One test (or more) per row N1-N7, each failing on the
code before the fix; N1, N1b and N5 with a real second user (uid 65534, tests/cache/second_user.py)."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

import pytest

from dflash_base.errors import DoctorError
from dflash_doctor.cache import fsops, restore
from dflash_doctor.cache.manifest import BACKUP_OWNER_NAME, MARKER_NAME, backup_owner_bytes
from dflash_doctor.cache.restore import prune_backups, restore_snapshot
from dflash_doctor.cache.snapshot import take_snapshot
from dflash_doctor.cache.store import SnapshotStore
from tests.cache.helpers import CPU_BUILD, make_tree, manifest_for, tree_digests, write_raw_archive
from tests.cache.layout_helpers import write_marker
from tests.cache.second_user import OTHER_USER, SecondUser, needs_second_user
from tests.cache.test_attacks import restore_into, snapshot_of
from tests.cache.test_hostile import disk_state

ROOT = os.getuid() == 0


def _owned_by_other(path: Path) -> None:
    for folder, dirs, names in os.walk(path):
        for name in [*dirs, *names]:
            os.chown(Path(folder) / name, OTHER_USER, OTHER_USER)
    os.chown(path, OTHER_USER, OTHER_USER)


def _loot(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The attacker's own folder, with a file named like our backup record in it: what root must never
    write through a link to."""
    loot = tmp_path / "loot"
    loot.mkdir()
    (loot / BACKUP_OWNER_NAME).write_text("the attacker's own file")
    (loot / "notes").write_text("theirs")
    _owned_by_other(loot)
    return loot, _state_with_owners(loot)


def _state_with_owners(folder: Path) -> dict[str, str]:
    state = disk_state(folder)
    for rel in list(state):
        state[rel] += f" uid {os.lstat(folder / rel).st_uid}"
    return state


def _no_exchange(monkeypatch: pytest.MonkeyPatch) -> None:
    """A filesystem without renameat2(RENAME_EXCHANGE): the swap falls back to two renames."""
    monkeypatch.setattr(restore, "exchange", lambda a, b: False, raising=False)  # before the fix
    monkeypatch.setattr(fsops, "exchange_at", lambda *args: False, raising=False)


# -- N1: a link planted at an absent cache's name, in a shared (1777) parent


@needs_second_user
@pytest.mark.parametrize("swap", ["exchange", "two renames"])
def test_n1_a_link_planted_in_a_shared_parent_is_never_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swap: str
) -> None:
    archive, digests = snapshot_of(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    target = shared / "inductor"  # absent: torch has not made it yet
    loot, loot_before = _loot(tmp_path)
    if swap == "two renames":
        _no_exchange(monkeypatch)

    def plant(handle: int) -> None:
        os.symlink(str(loot), "inductor", dir_fd=handle)

    with SecondUser(shared, plant) as attacker:
        # A racer trying at every step of the restore (each file written, each swap step) until it lands.
        monkeypatch.setattr(restore, "_pause", lambda: "done" in attacker.answers or attacker.strike())
        try:
            restore_into(archive, target)
            outcome = "restored"
        except DoctorError as exc:
            outcome = exc.message
    assert _state_with_owners(loot) == loot_before, "root wrote into the attacker's folder through the link"
    if outcome == "restored":
        assert not target.is_symlink() and tree_digests(target) == digests
        assert "done" not in attacker.answers, "the restore reported success over the attacker's link"
    else:
        assert str(target) in outcome and "symbolic link" in outcome


# -- N1b: a parent another user owns


@needs_second_user
def test_n1b_a_parent_another_user_owns_is_refused_before_anything_moves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive, _ = snapshot_of(tmp_path)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    target = theirs / "inductor"
    old = make_tree(target, files=5, seed=9)  # the cache is root's, its folder is theirs
    os.chown(theirs, OTHER_USER, OTHER_USER)
    loot, loot_before = _loot(tmp_path)

    def steal(handle: int) -> None:
        os.rename("inductor", "kept", src_dir_fd=handle, dst_dir_fd=handle)
        os.symlink(str(loot), "inductor", dir_fd=handle)

    with SecondUser(theirs, steal) as attacker:
        monkeypatch.setattr(restore, "_pause", lambda: "done" in attacker.answers or attacker.strike())
        with pytest.raises(DoctorError) as refused:
            restore_into(archive, target)
        assert attacker.answers == [], "the restore went far enough for the attacker to act"
    assert f"uid {OTHER_USER}" in refused.value.message and "TORCHINDUCTOR_CACHE_DIR" in (
        refused.value.hint or ""
    )
    assert tree_digests(target) == old and not target.is_symlink()
    assert _state_with_owners(loot) == loot_before


@pytest.mark.parametrize("command", ["restore", "snapshot", "warm"])
def test_n1b_a_parent_others_can_write_is_refused_by_restore_snapshot_and_warm(
    cache_env: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    from dflash_doctor.cli import run
    from dflash_doctor.commands import cache as cache_commands

    source = tmp_path / "source"
    make_tree(source, files=3)
    cache_env["snapshots"].mkdir(parents=True, mode=0o700)
    take_snapshot({"inductor": source}, CPU_BUILD, "s", cache_env["snapshots"] / "s.tar.zst")
    open_parent = tmp_path / "open"
    open_parent.mkdir()
    open_parent.chmod(0o777)  # others can write, no sticky bit: anyone can rename the cache away
    cache = open_parent / "inductor"
    old = make_tree(cache, files=4, seed=5)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    compiled: list[object] = []
    monkeypatch.setattr(cache_commands, "run_warm_child", lambda *a, **k: compiled.append(a) or {})
    argv = {"restore": ["cache", "restore", "s", "--force"], "snapshot": ["cache", "snapshot"]}
    capsys.readouterr()
    assert run(argv.get(command, ["cache", "warm", "--no-snapshot"])) == 2
    err = capsys.readouterr().err.replace("\n", " ")
    assert "others can write" in err and "export TORCHINDUCTOR_CACHE_DIR=" in err
    assert compiled == [] and tree_digests(cache) == old and not (cache / MARKER_NAME).exists()


def test_n1b_a_sticky_shared_parent_of_root_or_ours_is_allowed(tmp_path: Path) -> None:
    archive, digests = snapshot_of(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    target = shared / "inductor"
    make_tree(target, files=3, seed=9)
    restore_into(archive, target)
    assert tree_digests(target) == digests


# -- N2: a folder of documents is not a cache, whatever its names or our marker say


def _documents(folder: Path) -> None:
    (folder / "ab").mkdir(parents=True)  # two characters, like Inductor's code folders
    (folder / "ab" / "thesis.tex").write_bytes(b"years of work")
    (folder / "my-thesis-drafts-2024").mkdir()  # 16+ characters of a hash's alphabet
    (folder / "my-thesis-drafts-2024" / "chapter1.tex").write_bytes(b"chapter one")


@pytest.mark.parametrize("marker", [False, True], ids=["hash-like names", "our marker planted"])
def test_n2_documents_with_cache_like_names_are_never_moved(tmp_path: Path, marker: bool) -> None:
    archive, _ = snapshot_of(tmp_path)
    docs = tmp_path / "docs"
    _documents(docs)
    if marker:  # what `cache snapshot` used to write into any folder it was pointed at
        write_marker(docs, CPU_BUILD, str(docs), "s")
    before = disk_state(tmp_path)
    for _ in range(restore.KEEP_BACKUPS + 1):
        with pytest.raises(DoctorError, match="does not look like a compile cache"):
            restore_into(archive, docs)
    assert disk_state(tmp_path) == before
    assert (docs / "ab" / "thesis.tex").read_bytes() == b"years of work"


def test_n2_snapshot_refuses_a_folder_that_is_not_a_cache(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    _documents(docs)
    before = disk_state(tmp_path)
    with pytest.raises(DoctorError, match="does not look like a compile cache"):
        take_snapshot({"inductor": docs}, CPU_BUILD, "s", tmp_path / "s.tar.zst")
    assert disk_state(tmp_path) == before  # no archive, no marker written into it


def test_n2_a_backup_that_holds_documents_is_never_pruned(tmp_path: Path) -> None:
    """A backup made before the content rule (the marker made a folder of documents a cache)."""
    target = tmp_path / "caches" / "inductor"
    make_tree(target, files=3)
    backup = target.parent / "inductor.bak-20200101T000000Z-aaaaaa"
    _documents(backup)
    (backup / BACKUP_OWNER_NAME).write_bytes(backup_owner_bytes("old", str(target), 1.0, False))
    assert prune_backups(target, keep=0) == []
    assert (backup / "ab" / "thesis.tex").read_bytes() == b"years of work"


# -- N3: nested roots


@pytest.mark.parametrize("inner", ["triton", "inductor"])
def test_n3_nested_roots_are_refused_before_anything_moves(tmp_path: Path, inner: str) -> None:
    sources = {"inductor": tmp_path / "src-i", "triton": tmp_path / "src-t"}
    make_tree(sources["inductor"], files=6, seed=1)
    make_tree(sources["triton"], files=6, seed=2)
    archive = take_snapshot(sources, CPU_BUILD, "two", tmp_path / "two.tar.zst").path
    outer = tmp_path / "caches" / "outer"
    make_tree(outer, files=6, seed=3)
    roots = (
        {"inductor": outer, "triton": outer / "triton"}
        if inner == "triton"
        else {"triton": outer, "inductor": outer / "inductor"}
    )
    make_tree(roots[inner], files=6, seed=4)
    before = disk_state(tmp_path)
    for attempt in ("snapshot", "restore"):
        with pytest.raises(DoctorError) as refused:
            if attempt == "snapshot":
                take_snapshot(roots, CPU_BUILD, "nested", tmp_path / "nested.tar.zst")
            else:
                restore_snapshot(archive, roots, CPU_BUILD)
        message = refused.value.message
        assert "TRITON_CACHE_DIR" in message and "TORCHINDUCTOR_CACHE_DIR" in message and "inside" in message
        assert disk_state(tmp_path) == before


def test_n3_the_cli_names_the_variables(
    cache_env: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dflash_doctor.cli import run

    make_tree(cache_env["inductor"], files=4)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache_env["inductor"] / "triton"))
    capsys.readouterr()
    assert run(["cache", "snapshot"]) == 2
    err = capsys.readouterr().err.replace("\n", " ")
    assert "TRITON_CACHE_DIR" in err and "inside TORCHINDUCTOR_CACHE_DIR" in err


def test_n3_check_fails_nested_roots_before_any_command_runs(
    cache_env: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from dflash_doctor.cli import run

    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache_env["inductor"] / "triton"))
    capsys.readouterr()
    assert run(["cache", "status", "--json"]) == 1
    found = {f["id"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    assert found["cache.nested_roots"]["severity"] == "fail"
    assert "unset TRITON_CACHE_DIR" in found["cache.nested_roots"]["remedy"]


# -- N4: the store lock opens like the folder lock


@pytest.mark.parametrize("plant", ["symbolic link", "hard link", "another user's file"])
def test_n4_the_store_lock_follows_nothing_and_truncates_nothing(tmp_path: Path, plant: str) -> None:
    if plant == "another user's file" and not ROOT:
        pytest.skip("making another user's file needs root (chown)")
    store = SnapshotStore(tmp_path / "store")
    store.ensure()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    victim.chmod(0o600)
    lock = store.root / ".store.lock"
    if plant == "symbolic link":
        lock.symlink_to(victim)
    elif plant == "hard link":
        os.link(victim, lock)
    else:
        lock.write_bytes(b"")
        os.chown(lock, OTHER_USER, OTHER_USER)
    with pytest.raises(DoctorError, match="store lock"), store.locked(timeout=1):
        pass
    assert victim.read_bytes() == b"precious" and stat.S_IMODE(victim.stat().st_mode) == 0o600


def test_n4_the_warm_records_lock_follows_nothing(tmp_path: Path) -> None:
    from dflash_doctor.cache.warm_record import WarmRecords

    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    records = WarmRecords(tmp_path / "home" / "warm-records.json")
    records.path.parent.mkdir()
    os.link(victim, f"{records.path}.lock")
    with pytest.raises(DoctorError, match="lock"):
        records.save("key", ("cpu",), {"inductor/ab/cab.py": 1})
    assert victim.read_bytes() == b"precious"


def test_n4_the_filelock_floor_admits_no_version_that_follows_links() -> None:
    """filelock before 3.20.1 opened its lock with O_TRUNC and followed links (CVE-2025-68146), its
    SoftFileLock before 3.20.3 too (CVE-2026-22701); the launcher's output lock still uses it."""
    from packaging.requirements import Requirement

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    line = next(item for item in text.split('"') if item.startswith("filelock"))
    assert not Requirement(line).specifier.contains("3.20.2")


# -- N5: another user taking the lock's name first


@needs_second_user
def test_n5_a_lock_name_taken_by_another_user_blocks_nothing(tmp_path: Path) -> None:
    archive, digests = snapshot_of(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    target = shared / "inductor"
    make_tree(target, files=3, seed=9)

    def take_the_name(handle: int) -> None:
        flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
        os.close(os.open(".inductor.dflash-doctor.lock", flags, 0o644, dir_fd=handle))

    with SecondUser(shared, take_the_name) as attacker:
        assert attacker.strike() == "done"
    restore_into(archive, target)
    assert tree_digests(target) == digests
    take_snapshot({"inductor": target}, CPU_BUILD, "again", tmp_path / "again.tar.zst")
    assert os.lstat(shared / ".inductor.dflash-doctor.lock").st_uid == OTHER_USER  # theirs, left alone


@pytest.mark.skipif(not ROOT, reason="making another user's file needs root (chown)")
def test_n5_with_the_name_taken_the_commands_of_one_home_still_wait_for_each_other(tmp_path: Path) -> None:
    from dflash_doctor.cache.folder_lock import folder_lock

    archive, _ = snapshot_of(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    target = shared / "inductor"
    old = make_tree(target, files=3, seed=9)
    taken = shared / ".inductor.dflash-doctor.lock"
    taken.write_bytes(b"")
    os.chown(taken, OTHER_USER, OTHER_USER)
    with folder_lock(target), pytest.raises(DoctorError, match="another dflash-doctor command is using"):
        restore_into(archive, target, lock_timeout=0.2)
    assert tree_digests(target) == old


# -- N6: an empty archive, or one far smaller than the cache it replaces


def test_n6_an_empty_archive_over_a_cache_asks_for_force(tmp_path: Path) -> None:
    target = tmp_path / "caches" / "inductor"
    old = make_tree(target, files=20, seed=9)
    empty = write_raw_archive(tmp_path / "empty.tar.zst", manifest_for({}), [])
    with pytest.raises(DoctorError, match="--force"):
        restore_into(empty, target)
    assert tree_digests(target) == old
    kept = restore_into(empty, target, force=True).backups["inductor"]
    archive, _ = snapshot_of(tmp_path)
    for _ in range(restore.KEEP_BACKUPS + 1):
        restore_into(archive, target)
    assert tree_digests(kept) == old, "the cache an empty archive replaced was pruned"


def test_n6_a_far_smaller_archive_keeps_the_replaced_cache_out_of_retention(tmp_path: Path) -> None:
    target = tmp_path / "caches" / "inductor"
    old = make_tree(target, files=40, seed=9)
    small, _ = snapshot_of(tmp_path, "small", files=2)
    kept = restore_into(small, target).backups["inductor"]
    for _ in range(restore.KEEP_BACKUPS + 1):
        restore_into(small, target)
    assert tree_digests(kept) == old


# -- N7: a kill while a backup is deleted


def test_n7_a_kill_while_deleting_a_backup_is_finished_by_the_next_run(tmp_path: Path) -> None:
    archive, _ = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    make_tree(target, files=30, seed=9)
    restore_into(archive, target)  # one backup, with its ownership record
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: killed at the first deletion after the record's
        record_gone = False
        real_unlink, real_rmdir = os.unlink, os.rmdir

        def watched(real):  # type: ignore[no-untyped-def]
            def call(path, *args, **kwargs):  # type: ignore[no-untyped-def]
                nonlocal record_gone
                if record_gone:
                    os.kill(os.getpid(), signal.SIGKILL)
                real(path, *args, **kwargs)
                record_gone = record_gone or os.path.basename(os.fsdecode(path)) == BACKUP_OWNER_NAME

            return call

        os.unlink, os.rmdir = watched(real_unlink), watched(real_rmdir)
        try:
            prune_backups(target, keep=0)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status), "the deletion finished before the kill"
    restore_into(archive, target)  # the next run
    beside = [p for p in target.parent.iterdir() if p != target and not p.name.endswith(".lock")]
    for path in beside:
        assert path.name.startswith("inductor.bak-"), f"{path.name} left beside the cache"
        assert (path / BACKUP_OWNER_NAME).is_file(), f"{path.name}: a half-deleted backup leaked"
