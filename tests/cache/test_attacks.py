"""Issue 21: the cache store under attack. One test (or more) per row D1-D19 of the issue, each failing
on the code before the fix: planted links and names beside the cache, folders that are not caches,
other users' archives, crafted manifests and tar streams, kills between the swaps of two roots."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import stat
import tarfile
import threading
from pathlib import Path

import pytest
import zstandard

from dflash_base.errors import DoctorError
from dflash_doctor.cache import restore
from dflash_doctor.cache.archive import ReadLimits, collect_files, hash_files, read_manifest, write_archive
from dflash_doctor.cache.fingerprint import BuildFingerprint
from dflash_doctor.cache.folder_lock import LOCK_SUFFIX, folder_lock, lock_path
from dflash_doctor.cache.inspection import inspect_folder
from dflash_doctor.cache.manifest import MANIFEST_MEMBER, MARKER_NAME, ArchiveError, CacheManifest
from dflash_doctor.cache.restore import prune_backups, recover_interrupted, restore_snapshot
from dflash_doctor.cache.snapshot import take_snapshot
from dflash_doctor.cache.status import gather_status, warmth_of
from dflash_doctor.cache.store import SnapshotStore
from tests.cache.helpers import (
    CPU_BUILD,
    inductor_key,
    make_tree,
    manifest_for,
    tree_digests,
    write_raw_archive,
)
from tests.cache.test_hostile import disk_state

ROOT = os.getuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="making another user's file needs root (chown)")
OTHER_UID = 4242


def snapshot_of(
    tmp_path: Path, name: str = "snap", files: int = 8, seed: int = 3, build: BuildFingerprint = CPU_BUILD
) -> tuple[Path, dict[str, str]]:
    source = tmp_path / f"source-{name}"
    digests = make_tree(source, files=files, seed=seed)
    return take_snapshot({"inductor": source}, build, name, tmp_path / f"{name}.tar.zst").path, digests


def restore_into(archive: Path, target: Path, **kwargs: object) -> restore.RestoreResult:
    return restore_snapshot(archive, {"inductor": target}, CPU_BUILD, **kwargs)  # type: ignore[arg-type]


# -- D1: the partial archive


def test_d1_a_link_planted_at_the_partial_name_is_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / f".x.tar.zst.partial-{os.getpid()}").symlink_to(victim)  # the name the old code used
    source = tmp_path / "source"
    make_tree(source, files=3)
    result = take_snapshot({"inductor": source}, CPU_BUILD, "x", shared / "x.tar.zst")
    assert victim.read_bytes() == b"precious"
    assert read_manifest(result.path).name == "x"
    assert (shared / f".x.tar.zst.partial-{os.getpid()}").is_symlink()  # not ours: left alone


def test_d1_an_archive_never_replaces_a_file_planted_at_its_name(tmp_path: Path) -> None:
    source = tmp_path / "source"
    make_tree(source, files=3)
    files, _ = collect_files({"inductor": source})
    manifest = CacheManifest("x", 1.0, CPU_BUILD, {"inductor": str(source)}, hash_files(files))
    dest = tmp_path / "x.tar.zst"
    dest.write_bytes(b"planted")
    with pytest.raises(DoctorError, match="already exists"):
        write_archive(dest, manifest, files)
    assert dest.read_bytes() == b"planted"
    assert [p.name for p in tmp_path.iterdir() if ".partial-" in p.name] == []


# -- D2: one lock per cache folder, whichever home


def test_d2_a_restore_waits_for_the_lock_of_the_cache_folder_not_of_its_home(tmp_path: Path) -> None:
    archive, _ = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    with folder_lock(target), pytest.raises(DoctorError, match="another dflash-doctor command is using"):
        restore_into(archive, target, lock_timeout=0.2)
    assert not target.exists()
    assert [p.name for p in target.parent.iterdir() if "staging" in p.name] == []


def test_d2_two_restores_from_two_homes_at_once_swap_whole_trees(tmp_path: Path) -> None:
    a, digests_a = snapshot_of(tmp_path, "a", files=30, seed=1)
    b, digests_b = snapshot_of(tmp_path, "b", files=30, seed=2)
    target = tmp_path / "caches" / "inductor"
    for _trial in range(3):
        pids = []
        for index, archive in enumerate((a, b)):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                os.environ["DFLASH_DOCTOR_HOME"] = str(tmp_path / f"home{index}")
                os.environ[restore.PAUSE_VARIABLE] = "0.0005"
                code = 0
                try:
                    restore_into(archive, target)
                except BaseException:
                    code = 1
                os._exit(code)
            pids.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
        assert codes == [0, 0]
        assert tree_digests(target) in (digests_a, digests_b)
        for backup in target.parent.glob("inductor.bak-*"):
            assert tree_digests(backup) in (digests_a, digests_b)
        assert [p.name for p in target.parent.iterdir() if "staging" in p.name] == []


# -- D3: retention deletes only our backups, newest by recorded time


def test_d3_a_users_own_bak_folder_is_never_deleted(tmp_path: Path) -> None:
    archive, _ = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    make_tree(target, files=3, seed=9)
    mine = target.parent / "inductor.bak-2024"
    make_tree(mine, files=2, seed=10)
    before = tree_digests(mine)
    for _ in range(restore.KEEP_BACKUPS + 2):
        result = restore_into(archive, target)
    assert tree_digests(mine) == before
    assert any(str(mine) in line for line in result.left_alone)


def test_d3_planted_files_named_like_backups_never_evict_a_new_backup(tmp_path: Path) -> None:
    archive, _ = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    make_tree(target, files=3, seed=9)
    for name in ("inductor.bak-zz", "inductor.bak-zy"):
        (target.parent / name).write_text("planted")
    for _ in range(3):
        result = restore_into(archive, target)
        assert result.backups["inductor"].is_dir()  # "previous kept as ..." is true
    assert (target.parent / "inductor.bak-zz").read_text() == "planted"


def test_d3_retention_follows_the_recorded_time_not_the_name(tmp_path: Path) -> None:
    """Ids that sort backwards (a clock stepped back): the newest backups by time are kept."""
    archive, _ = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    make_tree(target, files=3, seed=9)
    made = []
    for restore_id in ("20991231T000000Z-aaaaaa", "20000101T000000Z-aaaaaa", "20000101T000000Z-bbbbbb"):
        made.append(restore_into(archive, target, restore_id=restore_id).backups["inductor"])
    assert not made[0].exists() and made[1].is_dir() and made[2].is_dir()


def test_d3_restore_ids_are_utc() -> None:
    assert restore.new_restore_id(0).startswith("19700101T000000Z-")


# -- D4: the target must look like a compile cache


def test_d4_a_folder_of_documents_is_never_moved_even_with_force(tmp_path: Path) -> None:
    archive, _ = snapshot_of(tmp_path)
    docs = tmp_path / "Documents"
    docs.mkdir()
    (docs / "thesis.docx").write_bytes(b"years of work")
    (docs / "photos").mkdir()
    before = disk_state(tmp_path)
    for force in (False, True):
        with pytest.raises(DoctorError, match="does not look like a compile cache"):
            restore_into(archive, docs, force=force)
    assert disk_state(tmp_path) == before


def test_d4_replace_non_cache_keeps_the_folder_as_a_backup_never_pruned(tmp_path: Path) -> None:
    archive, digests = snapshot_of(tmp_path)
    docs = tmp_path / "Documents"
    docs.mkdir()
    (docs / "thesis.docx").write_bytes(b"years of work")
    first = restore_into(archive, docs, replace_non_cache=True).backups["inductor"]
    for _ in range(restore.KEEP_BACKUPS + 1):
        restore_into(archive, docs)
    assert (first / "thesis.docx").read_bytes() == b"years of work"
    assert tree_digests(docs) == digests


def test_d4_a_real_inductor_layout_and_an_empty_folder_are_caches(tmp_path: Path) -> None:
    archive, _ = snapshot_of(tmp_path)
    target = tmp_path / "inductor"
    for name in ("ab", "fxgraph", "aotautograd", "locks", "triton", "precompiled_headers"):
        (target / name).mkdir(parents=True)
    restore_into(archive, target)
    empty = tmp_path / "empty"
    empty.mkdir()
    restore_into(archive, empty)


# -- D5, D6: nothing planted beside the cache is moved in or deleted


def test_d5_the_staging_name_does_not_reveal_the_restore_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive, _ = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    seen: list[str] = []
    monkeypatch.setattr(restore, "_pause", lambda: seen.extend(os.listdir(target.parent)))
    restore_into(archive, target, restore_id="20261201T000000Z-abcdef")
    stagings = {name for name in seen if "staging" in name}
    assert stagings and not any("abcdef" in name for name in stagings)


def test_d5_a_planted_backup_name_neither_breaks_the_restore_nor_gets_deleted(tmp_path: Path) -> None:
    archive, digests = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    old = make_tree(target, files=3, seed=9)
    planted = target.parent / "inductor.bak-fixed"
    make_tree(planted, files=2, seed=11)
    before = tree_digests(planted)
    result = restore_into(archive, target, restore_id="fixed")
    assert tree_digests(target) == digests and tree_digests(result.backups["inductor"]) == old
    for _ in range(restore.KEEP_BACKUPS + 1):
        restore_into(archive, target)
    assert tree_digests(planted) == before


def test_d6_planted_staging_and_backup_are_never_moved_in(tmp_path: Path) -> None:
    target = tmp_path / "caches" / "inductor"
    target.parent.mkdir(parents=True)
    staging = target.parent / ".inductor.dflash-staging-x"
    backup = target.parent / "inductor.bak-x"
    make_tree(staging, files=2, seed=12)
    make_tree(backup, files=2, seed=13)
    if ROOT:
        for folder in (staging, backup):
            os.chown(folder, OTHER_UID, OTHER_UID)
    other = dataclasses.replace(CPU_BUILD, torch_version="2.11.0+cu130")
    archive = write_raw_archive(
        tmp_path / "other.tar.zst",
        manifest_for({"inductor/ab/c.py": b"x"}, other),
        [("inductor/ab/c.py", b"x")],
    )
    before = disk_state(tmp_path)
    with pytest.raises(ArchiveError, match="another build"):
        restore_into(archive, target)
    assert not target.exists()
    assert disk_state(tmp_path) == before


# -- D7: one restore swaps all its roots or none


def _two_root_setup(
    tmp_path: Path,
) -> tuple[Path, dict[str, Path], dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    new_src = {"inductor": tmp_path / "new-i", "triton": tmp_path / "new-t"}
    new = {label: make_tree(path, files=20, seed=20 + i) for i, (label, path) in enumerate(new_src.items())}
    archive = take_snapshot(new_src, CPU_BUILD, "two", tmp_path / "two.tar.zst").path
    targets = {"inductor": tmp_path / "run" / "inductor", "triton": tmp_path / "run" / "triton"}
    old = {label: make_tree(path, files=10, seed=30 + i) for i, (label, path) in enumerate(targets.items())}
    return archive, targets, old, new


def test_d7_a_kill_between_the_two_roots_is_rolled_forward(tmp_path: Path) -> None:
    archive, targets, old, new = _two_root_setup(tmp_path)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: killed right after the first root's swap
        real_swap = restore._swap

        def swap_then_die(*args: object) -> object:
            result = real_swap(*args)  # type: ignore[arg-type]
            os.kill(os.getpid(), signal.SIGKILL)
            return result

        restore._swap = swap_then_die  # type: ignore[assignment]
        try:
            restore_snapshot(archive, targets, CPU_BUILD)
        finally:
            os._exit(1)
    os.waitpid(pid, 0)
    states = {label: tree_digests(path) for label, path in targets.items()}
    assert states["inductor"] == new["inductor"] and states["triton"] == old["triton"]  # the kill's moment
    env = {"TORCHINDUCTOR_CACHE_DIR": str(targets["inductor"]), "TRITON_CACHE_DIR": str(targets["triton"])}
    status = gather_status(CPU_BUILD, env)
    assert (
        status.main.pending and warmth_of(status.main, CPU_BUILD).state == "cold"
    )  # `cache status`: not warm
    with folder_lock(targets["inductor"]), folder_lock(targets["triton"]):
        recover_interrupted(targets["inductor"])
    assert {label: tree_digests(path) for label, path in targets.items()} == new
    for label, target in targets.items():
        backups = list(target.parent.glob(f"{target.name}.bak-*"))
        assert len(backups) == 1 and tree_digests(backups[0]) == old[label]
    assert [p.name for p in targets["inductor"].parent.iterdir() if "staging" in p.name] == []


# -- D8: the store's permissions


@needs_root
def test_d8_another_users_archive_is_never_recommended_or_restored_by_name(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "store")
    store.root.mkdir(mode=0o700)
    source = tmp_path / "source"
    make_tree(source, files=3)
    take_snapshot({"inductor": source}, CPU_BUILD, "mine", store.path_for("mine"), now=1000.0)
    theirs = take_snapshot(
        {"inductor": source}, CPU_BUILD, "theirs", store.path_for("theirs"), now=4_070_908_800.0
    )
    os.chown(theirs.path, OTHER_UID, OTHER_UID)
    assert [s.name for s in store.compatible(CPU_BUILD)] == ["mine"]
    with pytest.raises(DoctorError, match="not trusted"):
        store.resolve("theirs")
    assert store.resolve("mine") == store.path_for("mine")


def test_d8_a_store_others_can_write_trusts_nothing(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "store")
    store.root.mkdir()
    source = tmp_path / "source"
    make_tree(source, files=3)
    take_snapshot({"inductor": source}, CPU_BUILD, "s", store.path_for("s"))
    assert [s.name for s in store.compatible(CPU_BUILD)] == ["s"]
    store.root.chmod(0o777)
    assert store.compatible(CPU_BUILD) == []
    with pytest.raises(DoctorError, match="writable by others"):
        store.resolve("s")


# -- D9, D10, D16, D17: parse limits on what an archive says


def _pax_header(records: dict[str, str]) -> bytes:
    return tarfile.TarInfo._create_pax_generic_header(records, tarfile.XHDTYPE, "utf-8")  # type: ignore[attr-defined]


def test_d9_pax_headers_are_bounded_in_total_per_member(tmp_path: Path) -> None:
    raw = manifest_for({}).to_bytes()
    info = tarfile.TarInfo(MANIFEST_MEMBER)
    info.size = len(raw)
    stream = b"".join(_pax_header({f"comment{i}": "x" * 600_000}) for i in range(3))
    stream += info.tobuf(tarfile.USTAR_FORMAT) + raw + bytes(-len(raw) % 512) + bytes(1024)
    archive = tmp_path / "pax.tar.zst"
    archive.write_bytes(zstandard.ZstdCompressor().compress(stream))
    with pytest.raises(ArchiveError, match="extension headers"):
        read_manifest(archive)


def _manifest_archive(tmp_path: Path, data: bytes | dict) -> Path:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return write_raw_archive(tmp_path / "crafted.tar.zst", raw, [])


@pytest.mark.parametrize(
    ("change", "expect"),
    [
        (lambda d: d.update(fingerprint=None), "fingerprint must be an object"),
        (lambda d: d["files"][0].__setitem__(3, "INF"), "Infinity"),
        (lambda d: d.update(created="HUGE"), "created must be a time"),
        (lambda d: d.update(created="NAN"), "NaN"),
        (lambda d: d["files"][0].__setitem__(4, "NAN"), "NaN"),
        (lambda d: d["files"][0].__setitem__(4, 1e300), "mtime"),
        (lambda d: d["files"][0].__setitem__(0, "inductor/" + "n" * 300), "longer than a filesystem allows"),
        (lambda d: d["fingerprint"].update(torch_version="2.13\x1b[2J"), "control characters"),
        (lambda d: d.update(skipped="DEEP"), "nested too deeply"),
    ],
)
def test_d10_d16_d17_crafted_manifests_are_named_errors(tmp_path: Path, change: object, expect: str) -> None:
    data = manifest_for({"inductor/ab/c.py": b"x"}).to_json()
    change(data)  # type: ignore[operator]
    raw = json.dumps(data).encode()
    raw = raw.replace(b'"INF"', b"Infinity").replace(b'"NAN"', b"NaN").replace(b'"HUGE"', b"1e300")
    raw = raw.replace(b'"DEEP"', b"[" * 100_000 + b"]" * 100_000)
    archive = _manifest_archive(tmp_path, raw)
    with pytest.raises(ArchiveError) as refused:
        read_manifest(archive)
    assert expect in refused.value.message and "\x1b" not in refused.value.message


def test_d10_a_fifo_in_the_store_does_not_hang_listing(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "store")
    store.root.mkdir(mode=0o700)
    os.mkfifo(store.root / "x.tar.zst")
    listed: list = []
    worker = threading.Thread(target=lambda: listed.extend(store.snapshots()), daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "cache list hangs on a FIFO"
    assert listed[0].manifest is None and "FIFO" in (listed[0].error or "")


# -- D11: a bomb is refused before a byte is written


def test_d11_a_member_far_larger_than_its_archive_is_refused_before_writing(tmp_path: Path) -> None:
    big = {"inductor/ab/big.so": bytes(4 << 20)}
    archive = write_raw_archive(tmp_path / "bomb.tar.zst", manifest_for(big), list(big.items()))
    target = tmp_path / "caches" / "inductor"
    limits = ReadLimits(max_expansion=10, expansion_slack_bytes=0)
    with pytest.raises(ArchiveError, match="not a compile cache"):
        restore_into(archive, target, limits=limits)
    beside = [p.name for p in target.parent.iterdir() if not p.name.endswith(LOCK_SUFFIX)]
    assert beside == []  # refused at the manifest: no journal, no staging folder, no byte


# -- D12: a file rewritten in place while being archived


def test_d12_a_file_rewritten_in_place_aborts_the_snapshot(tmp_path: Path) -> None:
    source = tmp_path / "source"
    make_tree(source, files=3)
    files, _ = collect_files({"inductor": source})
    manifest = CacheManifest("x", 1.0, CPU_BUILD, {"inductor": str(source)}, hash_files(files))
    victim = Path(files[0].path)
    before = os.stat(victim)
    with open(victim, "r+b") as handle:  # same inode, same size, mtime put back
        handle.write(b"\xff" * 4)
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(ArchiveError, match="changed while the snapshot"):
        write_archive(tmp_path / "x.tar.zst", manifest, files)
    assert not (tmp_path / "x.tar.zst").exists()


# -- D13: refusals come before the extraction


@pytest.mark.parametrize("kind", ["file", "dangling link", "mount point"])
def test_d13_an_unusable_target_is_refused_before_anything_is_written(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive, _ = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    target.parent.mkdir(parents=True)
    if kind == "file":
        target.write_text("a file")
    elif kind == "dangling link":
        target.symlink_to(tmp_path / "nowhere")
    else:
        make_tree(target, files=2)
        from dflash_doctor.cache import swap

        monkeypatch.setattr(swap, "is_mount_point_at", lambda fd, name: name == target.name)
    before = disk_state(tmp_path)
    with pytest.raises(DoctorError) as refused:
        restore_into(archive, target)
    assert kind.split()[-1] in refused.value.message or "regular file" in refused.value.message
    assert disk_state(tmp_path) == before


# -- D14: a restore's files are not writable by others, whatever the umask


def test_d14_a_restore_under_umask_000_writes_nothing_others_can_write(tmp_path: Path) -> None:
    archive, _ = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    previous = os.umask(0)
    try:
        restore_into(archive, target)
    finally:
        os.umask(previous)
    report = inspect_folder("inductor", target)
    assert report.unsafe_count == 0, report.unsafe_writable
    assert not os.stat(target / MARKER_NAME).st_mode & (stat.S_IWGRP | stat.S_IWOTH)


# -- D15: a torn marker temp file is never archived


def test_d15_a_torn_marker_temp_file_is_not_archived_and_is_cleaned(tmp_path: Path) -> None:
    cache = tmp_path / "inductor"
    make_tree(cache, files=3)
    torn = cache / f".{MARKER_NAME}.abc123.tmp"
    torn.write_text('{"sche')
    result = take_snapshot({"inductor": cache}, CPU_BUILD, "s", tmp_path / "s.tar.zst")
    assert not any(MARKER_NAME in f.path for f in result.manifest.files)
    assert not torn.exists()


# -- D16: tracebacks become messages


def test_d16_a_full_disk_is_a_message_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive, _ = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    old = make_tree(target, files=3, seed=9)
    real_write = os.write

    def full(fd: int, data: object) -> int:
        if fd > 2 and os.path.realpath(f"/proc/self/fd/{fd}").startswith(str(target.parent)):
            raise OSError(28, "No space left on device")
        return real_write(fd, data)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(DoctorError, match="no space left"):
        restore_into(archive, target)
    monkeypatch.undo()
    assert tree_digests(target) == old
    assert [p.name for p in target.parent.iterdir() if "staging" in p.name] == []


_K = inductor_key("clash")


@pytest.mark.parametrize(
    ("members", "expect"),
    [
        (  # named as Inductor names its files, so that only the clash is wrong with it (issue 58, H3)
            {f"inductor/{_K[:2]}/c{_K}.py": b"file", f"inductor/{_K[:2]}/c{_K}.py/f{_K}": b"inside"},
            "a file and a folder of the same name",
        ),
        ({f"inductor/{MARKER_NAME}": b"{}"}, "keeps for its own records"),
    ],
)
def test_d16_conflicting_and_reserved_members_are_named_errors(
    tmp_path: Path, members: dict, expect: str
) -> None:
    archive = write_raw_archive(tmp_path / "bad.tar.zst", manifest_for(members), list(members.items()))
    target = tmp_path / "caches" / "inductor"
    with pytest.raises(ArchiveError, match=expect):
        restore_into(archive, target)
    assert not target.exists()


@pytest.mark.parametrize("kind", ["folder", "link"])
def test_d16_a_lock_path_that_is_a_folder_or_a_link_is_a_message(tmp_path: Path, kind: str) -> None:
    archive, _ = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    target.parent.mkdir(parents=True)
    where = lock_path(target)
    if kind == "folder":
        where.mkdir()
    else:
        (tmp_path / "victim").write_text("x")
        where.symlink_to(tmp_path / "victim")
    with pytest.raises(DoctorError, match=f"is a {kind if kind == 'folder' else 'symbolic link'}"):
        restore_into(archive, target)
    assert (tmp_path / "victim").read_text() == "x" if kind == "link" else where.is_dir()


# -- D18: a truncated copy is not listed as restorable


def test_d18_a_truncated_copy_is_listed_unreadable(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "store")
    store.root.mkdir(mode=0o700)
    source = tmp_path / "source"
    make_tree(source, files=60, size=40_000)
    good = take_snapshot({"inductor": source}, CPU_BUILD, "new", store.path_for("new")).path
    store.path_for("cut").write_bytes(good.read_bytes()[: good.stat().st_size * 6 // 10])
    listed = {s.name: s for s in store.snapshots()}
    assert listed["cut"].manifest is None and "truncated" in (listed["cut"].error or "")
    assert [s.name for s in store.compatible(CPU_BUILD)] == ["new"]


# -- the ownership records themselves


def test_backups_carry_an_ownership_record_and_prune_reads_only_those(tmp_path: Path) -> None:
    archive, _ = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    make_tree(target, files=3, seed=9)
    backup = restore_into(archive, target, restore_id="rid").backups["inductor"]
    owner = json.loads((backup / ".dflash-doctor-backup.json").read_text())
    assert owner["restore_id"] == "rid" and owner["uid"] == os.getuid() and owner["target"] == str(target)
    assert prune_backups(target, keep=0) == [backup]
    shutil.rmtree(target)


@needs_root
def test_prune_never_deletes_another_users_archive(
    cache_env: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from dflash_doctor.cli import run

    make_tree(cache_env["inductor"], files=2)
    for name in ("a", "b", "c"):
        assert run(["cache", "snapshot", "--name", name]) == 0
    theirs = cache_env["snapshots"] / "a.tar.zst"
    os.chown(theirs, OTHER_UID, OTHER_UID)
    assert run(["cache", "prune", "--keep", "0"]) == 0
    assert theirs.exists() and sorted(p.name for p in cache_env["snapshots"].glob("*.tar.zst")) == [
        "a.tar.zst"
    ]


def test_d17_escape_sequences_never_reach_the_terminal(
    cache_env: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dflash_doctor.cli import run

    hostile = dataclasses.replace(CPU_BUILD, torch_version="2.13\x1b]0;owned\x07\x1b[2J")
    members = {"inductor/ab/c.py": b"x"}
    cache_env["snapshots"].mkdir(parents=True, mode=0o700)
    archive = write_raw_archive(
        cache_env["snapshots"] / "evil.tar.zst", manifest_for(members, hostile), list(members.items())
    )
    capsys.readouterr()
    assert run(["cache", "list"]) == 0
    assert run(["cache", "restore", str(archive)]) == 2
    printed = capsys.readouterr()
    assert "\x1b" not in printed.out + printed.err and "\x07" not in printed.out + printed.err
    assert "evil" in printed.out and "control characters" in printed.out.replace("\n", "")
