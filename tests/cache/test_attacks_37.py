"""Issue 37: the cache store's third attack round. One test (or more) per row, named by the row, each
failing on the code before its fix; a real second user (uid 65534) or a real bind mount (a child in its
own mount namespace, `unshare -m`) where the row needs one, skipped with the reason elsewhere."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_base.errors import DoctorError
from dflash_doctor.cache import fsops, restore
from dflash_doctor.cache.folder_lock import folder_lock
from dflash_doctor.cache.journal import journal_path
from dflash_doctor.cache.locations import check_apart
from dflash_doctor.cache.manifest import BACKUP_OWNER_NAME, backup_owner_bytes
from dflash_doctor.cache.parent_dir import ParentDir
from dflash_doctor.cache.restore import prune_backups
from dflash_doctor.cache.snapshot import take_snapshot
from dflash_doctor.cache.store import SnapshotStore
from dflash_doctor.cli import run
from tests.cache.helpers import CPU_BUILD, live_build, make_tree, tree_digests
from tests.cache.layout_helpers import examine_path
from tests.cache.second_user import OTHER_USER, SecondUser, needs_second_user
from tests.cache.test_attacks import restore_into, snapshot_of
from tests.cache.test_hostile import disk_state

ROOT = os.getuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="making another user's folder needs root (chown)")
REPO = Path(__file__).resolve().parents[2]


def _shared(tmp_path: Path) -> Path:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    return shared


# -- G3: two homes, one cache, the lock's name taken by another user


@needs_second_user
def test_g3_two_homes_exclude_each_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive, _ = snapshot_of(tmp_path)
    shared = _shared(tmp_path)
    target = shared / "inductor"
    old = make_tree(target, files=3, seed=9)

    def take_the_name(handle: int) -> None:
        flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
        os.close(os.open(".inductor.dflash-doctor.lock", flags, 0o644, dir_fd=handle))

    with SecondUser(shared, take_the_name) as attacker:
        assert attacker.strike() == "done"
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home-a"))
    with folder_lock(target):  # home A restores...
        monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home-b"))
        with pytest.raises(DoctorError, match="another dflash-doctor command is using"):
            restore_into(archive, target, lock_timeout=0.2)  # ...and home B waits
    assert tree_digests(target) == old


def test_g3_two_spellings_of_one_folder_share_its_lock(tmp_path: Path) -> None:
    archive, _ = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    make_tree(target, files=3, seed=9)
    (tmp_path / "alias").symlink_to(tmp_path / "caches")
    with folder_lock(target), pytest.raises(DoctorError, match="another dflash-doctor command is using"):
        restore_into(archive, tmp_path / "alias" / "inductor", lock_timeout=0.2)


def test_g3_verified_is_said_only_of_what_is_on_disk_at_the_swap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process deleting files of the staging folder after they were verified: never swapped in."""
    archive, _ = snapshot_of(tmp_path, files=12)
    target = tmp_path / "caches" / "inductor"
    old = make_tree(target, files=3, seed=9)
    real = restore.extract_verified

    def extract_then_lose_a_file(*args: object, **kwargs: object) -> object:
        manifest = real(*args, **kwargs)  # type: ignore[arg-type]
        staging = next(target.parent.glob(".inductor.dflash-staging-*"))
        victim = next(p for p in sorted(staging.rglob("*")) if p.is_file() and p.name.startswith("c"))
        victim.unlink()
        return manifest

    monkeypatch.setattr(restore, "extract_verified", extract_then_lose_a_file)
    with pytest.raises(DoctorError, match="staging folder no longer holds what was verified"):
        restore_into(archive, target)
    assert tree_digests(target) == old
    assert not list(target.parent.glob(".inductor.dflash-*")) or all(
        p.name.endswith(".lock") for p in target.parent.glob(".inductor.dflash-*")
    )
    assert not journal_path(target).exists()


# -- A1: a folder above the cache's parent that another user owns (or others can write)


@needs_root
def test_a1_a_folder_above_the_parent_of_another_user_is_refused(tmp_path: Path) -> None:
    archive, _ = snapshot_of(tmp_path)
    att = tmp_path / "att"
    (att / "p").mkdir(parents=True)
    os.chown(att, OTHER_USER, OTHER_USER)
    target = att / "p" / "inductor"
    before = disk_state(att)
    with pytest.raises(DoctorError, match=f"{att} belongs to uid {OTHER_USER}"):
        restore_into(archive, target)
    with pytest.raises(DoctorError, match=f"{att} belongs to uid {OTHER_USER}"):
        take_snapshot({"inductor": target}, CPU_BUILD, "s", tmp_path / "s.tar.zst")
    assert disk_state(att) == before and not list((att / "p").iterdir())  # no cache, no lock made


def test_a1_a_folder_above_that_others_can_write_without_the_sticky_bit_is_refused(tmp_path: Path) -> None:
    archive, _ = snapshot_of(tmp_path)
    open_folder = tmp_path / "open"
    (open_folder / "p").mkdir(parents=True)
    open_folder.chmod(0o777)
    with pytest.raises(DoctorError, match=f"{open_folder} is a folder others can write"):
        restore_into(archive, open_folder / "p" / "inductor")
    assert not list((open_folder / "p").iterdir())


@needs_root
def test_a1_check_fails_parent_writable_for_a_folder_above(tmp_path: Path) -> None:
    from checks.cache import _parent_findings
    from dflash_doctor.cache.inspection import inspect_folder

    att = tmp_path / "att"
    (att / "p" / "inductor").mkdir(parents=True)
    os.chown(att, OTHER_USER, OTHER_USER)
    findings = list(_parent_findings(inspect_folder("inductor", att / "p" / "inductor")))
    assert [f.id for f in findings] == ["cache.parent_writable"]
    assert str(att) in findings[0].summary and f"uid {OTHER_USER}" in findings[0].summary


# -- F1: a folder of code and notes that borrows Inductor's names


def _code_and_notes(folder: Path) -> dict[str, str]:
    for rel, text in {
        "kernel/attn.cu": "__global__ void attn() {}",
        "kernel/NOTES.txt": "why the kernel is slow",
        "kernel/Makefile": "all:\n\tnvcc attn.cu",
        "triton/flash_attn.py": "import triton",
        "cache/thesis": "chapter one",
    }.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return tree_digests(folder)


def test_f1_code_and_notes_under_inductor_names_are_not_a_cache(tmp_path: Path) -> None:
    archive, _ = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    work = _code_and_notes(target)
    content = examine_path(target)
    assert content is not None and content.reason is not None
    with pytest.raises(DoctorError, match="does not look like a compile cache"):
        restore_into(archive, target)
    with pytest.raises(DoctorError, match="does not look like a compile cache"):
        take_snapshot({"inductor": target}, CPU_BUILD, "s", tmp_path / "s.tar.zst")
    assert tree_digests(target) == work


def test_f1_retention_never_deletes_a_backup_that_is_not_provably_a_cache(tmp_path: Path) -> None:
    target = tmp_path / "caches" / "inductor"
    make_tree(target, files=3)
    backup = target.parent / "inductor.bak-20200101T000000Z-aaaaaa"
    work = _code_and_notes(backup)
    (backup / BACKUP_OWNER_NAME).write_bytes(backup_owner_bytes("old", str(target), 1.0, False))
    assert prune_backups(target, keep=0) == []
    assert tree_digests(backup) == work


def test_f1_real_layouts_are_still_caches(tmp_path: Path) -> None:
    from tests.cache.test_layout import LAYOUTS, build_listing

    for listing in sorted(LAYOUTS.glob("*.txt")):
        built = tmp_path / listing.stem
        build_listing(listing, built)
        content = examine_path(built)
        assert content is not None and content.reason is None and not content.strangers, listing.name


# -- F2: a real cache with a few stray entries


def _stray(cache: Path, kind: str) -> str:
    code = next(p for p in sorted(cache.iterdir()) if p.is_dir() and len(p.name) == 2)
    py = next(p for p in sorted(code.iterdir()) if p.name.startswith("c"))
    made = {
        "swap": code / f".{py.name}.swp",
        "emacs-lock": code / f".#{py.name}",
        "emacs-autosave": code / f"#{py.name}#",
        "nfs": code / ".nfs000000000123abcd00000001",
        "pycache": code / "__pycache__" / f"{py.stem}.cpython-311.pyc",
        "log": cache / "compile.log",
        "mlir": code / "kernel.mlir",
        "core": cache / "core",
    }
    if kind == "link":
        (cache / "latest").symlink_to(code)
        return "latest"
    path = made[kind]
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"stray")
    top = path.relative_to(cache).parts
    return "/".join(top[:2]) if kind == "pycache" else str(path.relative_to(cache))


STRAYS = ["swap", "emacs-lock", "emacs-autosave", "nfs", "pycache", "log", "mlir", "link", "core"]


@pytest.mark.parametrize("kind", STRAYS)
def test_f2_a_cache_with_a_stray_entry_is_still_a_cache(tmp_path: Path, kind: str) -> None:
    cache = tmp_path / "caches" / "inductor"
    digests = make_tree(cache, files=40)
    stray = _stray(cache, kind)
    content = examine_path(cache)
    assert content is not None and content.reason is None
    assert any(s.rstrip("/") == stray for s in content.strangers)
    taken = take_snapshot({"inductor": cache}, CPU_BUILD, "s", tmp_path / "s.tar.zst")
    archived = {f.path.partition("/")[2] for f in taken.manifest.files}
    assert archived == set(digests)  # the stray left out, named
    assert any(stray in s for s in taken.manifest.skipped)
    result = restore_into(taken.path, cache)
    assert tree_digests(cache) == digests
    assert result.kept and stray in result.kept[0]  # the replaced folder held something of a person's


# -- A3: no /proc: no writes by path under the staging folder


def test_a3_without_proc_the_restore_refuses_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive, _ = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    old = make_tree(target, files=3, seed=9)
    before = disk_state(tmp_path / "caches")
    monkeypatch.setattr(restore, "fd_path", lambda fd: None)
    with pytest.raises(DoctorError, match="/proc"):
        restore_into(archive, target)
    assert disk_state(tmp_path / "caches") == before and tree_digests(target) == old


# -- B1 / B2: bind mounts, in a mount namespace of the test's own


def _in_mount_namespace(tmp_path: Path, script: str) -> dict[str, object]:
    """Run `script` (Python, after bind mounts it makes with `mount --bind`) in a private mount
    namespace; the JSON it prints last."""
    if not ROOT:
        pytest.skip("bind mounts need root")
    unshare, mount = shutil.which("unshare"), shutil.which("mount")
    if unshare is None or mount is None:
        pytest.skip("unshare or mount is not installed")
    probe = subprocess.run([unshare, "-m", "--propagation", "private", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace here: {probe.stderr.decode().strip()}")
    code = f"import json, os, subprocess, sys\nsys.path.insert(0, {str(REPO)!r})\n" + textwrap.dedent(script)
    done = subprocess.run(
        [unshare, "-m", "--propagation", "private", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "T": str(tmp_path)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_b1_a_bind_mounted_cache_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    archive, _ = snapshot_of(tmp_path)
    host = tmp_path / "host"
    make_tree(host, files=3, seed=9)
    (tmp_path / "caches" / "inductor").mkdir(parents=True)
    found = _in_mount_namespace(
        tmp_path,
        f"""
        from pathlib import Path
        from dflash_base.errors import DoctorError
        from tests.cache.test_attacks import restore_into
        T = Path(os.environ["T"])
        subprocess.run(["mount", "--bind", str(T / "host"), str(T / "caches" / "inductor")], check=True)
        try:
            restore_into(Path({str(archive)!r}), T / "caches" / "inductor")
            said = "restored"
        except DoctorError as exc:
            said = exc.message
        beside = sorted(n for n in os.listdir(T / "caches") if not n.endswith(".lock"))
        print(json.dumps({{"said": said, "beside": beside}}))
        """,
    )
    assert "mount point" in str(found["said"])
    assert found["beside"] == ["inductor"]  # no staging folder, no journal (the folder's lock aside)


def test_b1_a_journal_that_cannot_roll_forward_is_rolled_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive, _ = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    old = make_tree(target, files=3, seed=9)

    def busy(*args: object) -> bool:
        raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), "inductor")

    monkeypatch.setattr(fsops, "exchange_at", busy)
    with pytest.raises((DoctorError, OSError)):
        restore_into(archive, target)
    assert tree_digests(target) == old
    assert not journal_path(target).exists()
    assert not list(target.parent.glob(".inductor.dflash-staging-*"))
    monkeypatch.undo()
    restore_into(archive, target)  # the next restore is not stuck


def test_b2_nested_roots_through_a_bind_mount_are_refused(tmp_path: Path) -> None:
    inductor = tmp_path / "inductor"
    make_tree(inductor / "triton", files=2)
    (tmp_path / "elsewhere" / "triton").mkdir(parents=True)
    found = _in_mount_namespace(
        tmp_path,
        """
        from pathlib import Path
        from dflash_base.errors import DoctorError
        from dflash_doctor.cache.locations import check_apart
        T = Path(os.environ["T"])
        subprocess.run(["mount", "--bind", str(T / "inductor" / "triton"), str(T / "elsewhere" / "triton")], check=True)
        try:
            check_apart({"inductor": T / "inductor", "triton": T / "elsewhere" / "triton"})
            said = "accepted"
        except DoctorError as exc:
            said = exc.message
        print(json.dumps({"said": said}))
        """,
    )
    assert "TRITON_CACHE_DIR" in str(found["said"]) and "inside" in str(found["said"])


def test_b2_one_folder_by_two_paths_is_nested(tmp_path: Path) -> None:
    (tmp_path / "inductor").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "inductor")
    with pytest.raises(DoctorError, match="the same folder as"):
        check_apart({"inductor": tmp_path / "inductor", "triton": tmp_path / "alias"})


# -- T1: names and paths reach the terminal escaped


def test_t1_planted_names_and_escape_bytes_are_printed_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    archive, _ = snapshot_of(tmp_path)
    cache = tmp_path / "ca\x1b]0;owned\x07che" / "inductor"
    make_tree(cache, files=3, seed=9)
    (cache.parent / ".inductor.dflash-staging-x\n\u2713 restored forged: every sha256 verified").mkdir()
    (cache.parent / "inductor.bak-\x1b[2J").mkdir()
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    capsys.readouterr()
    assert run(["cache", "restore", str(archive), "--force"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert sum(line.lstrip().startswith("\u2713 restored") for line in out.splitlines()) == 1
    assert "left alone" in out  # the planted names are reported, escaped


def test_t1_an_error_naming_an_escaped_path_is_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    archive, _ = snapshot_of(tmp_path, build=live_build())
    cache = tmp_path / "x\x1b[31m" / "inductor"
    cache.mkdir(parents=True)
    (cache / "thesis.tex").write_text("mine")
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    capsys.readouterr()
    assert run(["cache", "restore", str(archive)]) == 2
    captured = capsys.readouterr()
    assert "does not look like a compile cache" in captured.err + captured.out
    assert "\x1b" not in captured.err + captured.out


# -- I1: folders we create are private whatever the umask


def test_i1_folders_we_create_are_0700_under_umask_000(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(home))
    old = os.umask(0)
    try:
        SnapshotStore(home / "cache" / "snapshots").ensure()
        ParentDir.open(home / "cache" / "inductor-parent" / "x").close()
    finally:
        os.umask(old)
    for folder in (home, home / "cache", home / "cache" / "snapshots", home / "cache" / "inductor-parent"):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700, folder


def test_i1_check_warns_on_a_home_others_can_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from checks.cache import home_findings

    home = tmp_path / "home"
    (home / "cache").mkdir(parents=True)
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(home))
    assert list(home_findings()) == []
    (home / "cache").chmod(0o777)
    found = list(home_findings())
    assert [f.id for f in found] == ["cache.home_writable"] and str(home / "cache") in found[0].summary


def test_i1_the_lock_folder_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    locks = tmp_path / "user" / "locks"
    monkeypatch.setenv("DFLASH_DOCTOR_LOCK_DIR", str(locks))
    target = tmp_path / "caches" / "inductor"
    old = os.umask(0)
    try:
        with folder_lock(target):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(locks).st_mode) == 0o700


def test_b1_a_journal_stuck_in_swapping_is_rolled_back_by_the_next_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal left in `swapping` over a target that cannot be exchanged (as the code before left it)."""
    archive, _ = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    old = make_tree(target, files=3, seed=9)

    def busy(*args: object) -> bool:
        raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), "inductor")

    monkeypatch.setattr(fsops, "exchange_at", busy)
    monkeypatch.setattr(restore._Restore, "_roll_back", lambda self, root, exc: None)  # the old code
    with pytest.raises(OSError):
        restore_into(archive, target)
    assert json.loads(journal_path(target).read_text())["phase"] == "swapping"
    monkeypatch.undo()
    monkeypatch.setattr(fsops, "exchange_at", busy)
    with pytest.raises(DoctorError, match="Device or resource busy"):
        restore_into(archive, target)  # recovery rolls the stuck one back; this one is rolled back too
    assert not journal_path(target).exists() and tree_digests(target) == old
    assert not list(target.parent.glob(".inductor.dflash-staging-*"))


# -- B3: the room a restore asks for is in proportion to the snapshot


def test_b3_a_small_snapshot_fits_a_small_tmpfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive, digests = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    monkeypatch.setattr(ParentDir, "free_bytes", lambda self: 48 << 20)  # a 64 MiB /dev/shm, 48 MiB free
    restore_into(archive, target)
    assert tree_digests(target) == digests


def test_b3_too_little_room_is_refused_with_the_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive, _ = snapshot_of(tmp_path, files=8)
    monkeypatch.setattr(ParentDir, "free_bytes", lambda self: 1000)
    with pytest.raises(
        DoctorError, match=r"needs 0\.\d MB \(0\.\d MB of files and a margin\), 0\.0 MB are free"
    ):
        restore_into(archive, tmp_path / "caches" / "inductor")


# -- Na: TORCHINDUCTOR_CACHE_DIR=/


def test_na_the_root_folder_as_the_cache_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    archive, _ = snapshot_of(tmp_path)
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/")
    capsys.readouterr()
    assert run(["cache", "restore", str(archive)]) == 2
    assert "TORCHINDUCTOR_CACHE_DIR=/ names the root folder" in capsys.readouterr().err


# -- K1 / J1: the store's rules whatever way an archive is named, and a store that is a link


@needs_root
def test_k1_an_archive_of_another_user_in_the_store_is_untrusted_by_path_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(home))
    store = SnapshotStore(home / "cache" / "snapshots")
    store.ensure()
    archive, _ = snapshot_of(tmp_path)
    planted = store.root / "theirs.tar.zst"
    shutil.copy(archive, planted)
    os.chown(planted, OTHER_USER, OTHER_USER)
    with pytest.raises(DoctorError, match=f"not trusted: .*uid {OTHER_USER}"):
        store.resolve(str(planted))
    assert store.resolve(str(archive)) == archive  # an archive outside the store, by its path: works


def test_j1_a_store_that_is_a_link_is_refused_up_front(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "snapshots").symlink_to(tmp_path / "elsewhere")
    store = SnapshotStore(tmp_path / "snapshots")
    with pytest.raises(DoctorError, match="is a symbolic link") as refused, store.locked():
        pass
    assert refused.value.hint is not None and "mkdir -m 700" in refused.value.hint
    assert not list((tmp_path / "elsewhere").iterdir())  # nothing written through it


# -- E2: a name no restore accepts is never archived


@pytest.mark.parametrize("bad", ["kernel\n.json", "kernel\udcff.json"], ids=["newline", "invalid utf-8"])
def test_e2_a_name_no_restore_accepts_is_skipped_at_snapshot(tmp_path: Path, bad: str) -> None:
    cache = tmp_path / "caches" / "inductor"
    digests = make_tree(cache, files=12)
    triton_key = cache / "triton" / "0" / "3UV6IQ7S2SU23V2PJU5H5I43RFGGKL2IZC5LHAAXBCKYAQVLCLIA"
    triton_key.mkdir(parents=True)
    (triton_key / "kernel.json").write_text("{}")
    (triton_key / "kernel.cubin").write_bytes(b"cubin")
    (triton_key / os.fsdecode(os.fsencode(bad))).write_text("{}")
    expected = tree_digests(cache)
    taken = take_snapshot({"inductor": cache}, CPU_BUILD, "s", tmp_path / "s.tar.zst")
    assert any("kernel\\" in s and s.isprintable() for s in taken.manifest.skipped)  # named, escaped
    restored = tmp_path / "restored" / "inductor"
    restore_into(taken.path, restored)  # the archive restores
    assert set(tree_digests(restored)) == set(expected) - {
        str((triton_key / bad).relative_to(cache))
    } and set(digests) <= set(tree_digests(restored))


# -- P1: the parent renamed mid-restore


def test_p1_a_parent_renamed_mid_restore_is_said_with_where_the_cache_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive, digests = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    make_tree(target, files=3, seed=9)
    moved = tmp_path / "moved"

    def rename_once() -> None:
        if not moved.exists():
            (tmp_path / "caches").rename(moved)

    monkeypatch.setattr(restore, "_pause", rename_once)
    result = restore_into(archive, target)
    assert tree_digests(moved / "inductor") == digests
    assert any(f"now {moved / 'inductor'}" in line for line in result.left_alone)


# -- B5: no inode left exactly when the journal moves to `swapping`


@pytest.mark.parametrize(
    ("code", "raised"), [(errno.ENOSPC, DoctorError), (errno.EDQUOT, DoctorError), (errno.EIO, OSError)]
)
def test_b5_a_failed_swapping_journal_write_removes_the_staging_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, raised: type[Exception]
) -> None:
    """The verified staging copy and the journal used to stay on the full disk (only the next restore or
    snapshot, once there was room, finished them); now whatever the write's error, they go at once."""
    archive, _ = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    old = make_tree(target, files=3, seed=9)
    real = fsops.write_atomic_at

    def no_inode_for_swapping(folder: int, name: str, data: bytes, mode: int = 0o600) -> None:
        if name == journal_path(target).name and b'"swapping"' in data:
            raise OSError(code, os.strerror(code))  # the temp file's O_CREAT finds no inode
        real(folder, name, data, mode)

    monkeypatch.setattr(fsops, "write_atomic_at", no_inode_for_swapping)
    with pytest.raises(raised) as failed:
        restore_into(archive, target)
    if raised is DoctorError:
        assert "no space left" in str(failed.value) and "staging folders were removed" in str(failed.value)
    assert tree_digests(target) == old
    beside = sorted(p.name for p in target.parent.iterdir() if not p.name.endswith(".lock"))
    assert beside == ["inductor"]  # no staging folder, no journal, no temp file (the folder's lock aside)
    monkeypatch.undo()
    restore_into(archive, target)  # once there is room, the next restore simply works


def test_b5_no_room_for_the_swapping_journal_of_an_absent_cache_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive, _ = snapshot_of(tmp_path)
    target = tmp_path / "caches" / "inductor"
    target.parent.mkdir(parents=True)
    real = fsops.write_atomic_at

    def no_inode_for_swapping(folder: int, name: str, data: bytes, mode: int = 0o600) -> None:
        if name == journal_path(target).name and b'"swapping"' in data:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(folder, name, data, mode)

    monkeypatch.setattr(fsops, "write_atomic_at", no_inode_for_swapping)
    with pytest.raises(DoctorError, match="no space left"):
        restore_into(archive, target)
    beside = [p.name for p in target.parent.iterdir() if not p.name.endswith(".lock")]
    assert beside == []  # not even the empty folder made to hold the cache's name


# -- D1: a tree 1,200 levels deep


DEEP = 1200


def _deep_chain(top: Path, levels: int = DEEP) -> str:
    """`top/0/0/.../0/` `levels` deep (device-index names, which Inductor's layout allows at any depth),
    a file at the bottom; made through handles (its path nears PATH_MAX). Its archive path from `top`."""
    top.mkdir(parents=True, exist_ok=True)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("0", dir_fd=fd)
            inner = os.open("0", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        os.close(os.open("f" + "a" * 52, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    return "0/" * levels


@pytest.fixture
def deep_cleanup(tmp_path: Path) -> Iterator[None]:
    """Empties tmp_path afterwards, leaf first, one handle open at a time (shutil.rmtree recurses, and
    the session's final rmtree would end in a RecursionError)."""
    yield
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    fd, names = os.open(tmp_path, flags), []  # names: the path from tmp_path to the folder `fd` is
    while True:
        with os.scandir(fd) as found:
            listed = [(e.name, e.is_dir(follow_symlinks=False)) for e in found]
        sub = next((name for name, is_dir in listed if is_dir), None)
        if sub is not None:
            inner = os.open(sub, flags, dir_fd=fd)
            os.close(fd)
            fd = inner
            names.append(sub)
            continue
        for name, _ in listed:
            os.unlink(name, dir_fd=fd)
        if not names:
            os.close(fd)
            return
        up = os.open("..", flags, dir_fd=fd)
        os.close(fd)
        fd = up
        os.rmdir(names.pop(), dir_fd=fd)


def test_d1_cache_status_walks_a_tree_1200_deep(
    cache_env: dict[str, Path], deep_cleanup: object, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = cache_env["inductor"]
    make_tree(cache, files=40)
    _deep_chain(cache / "fxgraph")
    capsys.readouterr()
    assert run(["cache", "status"]) in (0, 1)  # was 3: RecursionError in the walk
    assert "41 files" in capsys.readouterr().out  # the file 1,200 folders down counted


def test_d1_cache_snapshot_of_a_tree_1200_deep_leaves_the_deep_folder_out(
    cache_env: dict[str, Path], deep_cleanup: object, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = cache_env["inductor"]
    digests = make_tree(cache, files=40)
    _deep_chain(cache / "fxgraph")
    capsys.readouterr()
    assert run(["cache", "snapshot", "--name", "deep", "--json"]) == 0  # was 3: RecursionError
    made = json.loads(capsys.readouterr().out)
    assert made["files"] == len(digests)
    assert [s for s in made["skipped"] if s.startswith("inductor/fxgraph/" + "0/" * 31)]  # named, left out


def test_d1_cache_snapshot_says_what_it_left_out(
    cache_env: dict[str, Path], deep_cleanup: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not "skipped 1 link(s) or special file(s)" of a folder nested 1,200 deep: its path, cut."""
    cache = cache_env["inductor"]
    make_tree(cache, files=40)
    _deep_chain(cache / "fxgraph")
    capsys.readouterr()
    assert run(["cache", "snapshot", "--name", "deep"]) == 0
    out = capsys.readouterr().out
    assert "left out 1 entry no compiler wrote or no restore accepts (inductor/fxgraph/0/0/0/" in out
    assert "link(s)" not in out and len(max(out.splitlines(), key=len)) < 400


def test_d1_cache_restore_over_a_tree_1200_deep_keeps_it(
    cache_env: dict[str, Path], tmp_path: Path, deep_cleanup: object, capsys: pytest.CaptureFixture[str]
) -> None:
    archive, digests = snapshot_of(tmp_path, files=40, build=live_build())
    cache = cache_env["inductor"]
    make_tree(cache, files=40, seed=9)
    _deep_chain(cache / "fxgraph")
    capsys.readouterr()
    assert run(["cache", "restore", str(archive)]) == 0  # was 3: RecursionError judging the target
    out = capsys.readouterr().out
    assert tree_digests(cache) == digests
    assert "nested more than 32 deep" in out and "never deleted by retention" in out


def test_d1_cache_snapshot_of_only_a_deep_tree_is_refused(
    cache_env: dict[str, Path], deep_cleanup: object, capsys: pytest.CaptureFixture[str]
) -> None:
    _deep_chain(cache_env["inductor"] / "fxgraph")
    capsys.readouterr()
    assert run(["cache", "snapshot", "--name", "deep"]) == 2
    err = capsys.readouterr().err
    assert "does not look like a compile cache" in err and "nested more than 32 deep" in err
    assert not cache_env["snapshots"].exists() or not list(cache_env["snapshots"].glob("*.tar.zst"))


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_d1_cache_restore_of_an_archive_1200_deep_is_refused(
    cache_env: dict[str, Path], tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import tarfile

    from tests.cache.helpers import manifest_for, write_raw_archive

    deep = "inductor/" + "0/" * DEEP
    if kind == "file":
        members: dict[str, bytes] = {deep + "f" + "a" * 52: b"x"}
        extra: list[tarfile.TarInfo | tuple[str, bytes]] = list(members.items())
    else:  # a folder member, which the manifest does not list
        members = {"inductor/ab/c" + "a" * 52 + ".py": b"x"}
        folder = tarfile.TarInfo(deep.rstrip("/"))
        folder.type = tarfile.DIRTYPE
        extra = [*members.items(), folder]
    archive = write_raw_archive(tmp_path / "deep.tar.zst", manifest_for(members, live_build()), extra)
    capsys.readouterr()
    assert run(["cache", "restore", str(archive), "--force"]) == 2  # was 3: RecursionError making folders
    assert "more than 32 folders deep" in capsys.readouterr().err
    assert not cache_env["inductor"].exists() or not any(cache_env["inductor"].iterdir())
    assert not list(cache_env["inductor"].parent.glob(".inductor.dflash-staging-*"))


# -- B6 / B7: a read-only cache and a read-only store (read-only bind mounts, in a mount namespace)

_CLI_IN_CHILD = """
import contextlib, io
from pathlib import Path
from dflash_doctor.cli import run
T = Path(os.environ["T"])

def read_only(folder):
    subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
    subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], check=True)

def cli(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run(list(args))
    return {"code": code, "out": out.getvalue(), "err": err.getvalue()}
"""


def test_b6_a_cache_on_a_read_only_mount_can_be_snapshotted(
    tmp_path: Path, cache_env: dict[str, Path]
) -> None:
    cache = cache_env["inductor"]
    digests = make_tree(cache, files=12)
    found = _in_mount_namespace(
        tmp_path,
        _CLI_IN_CHILD
        + """
read_only(T / "caches")
print(json.dumps(cli("cache", "snapshot", "--name", "from-ro", "--json")))
""",
    )
    assert found["code"] == 0, found["err"]  # was 2: the lock beside the cache could not be created
    assert json.loads(str(found["out"]))["files"] == 12
    restored = tmp_path / "restored" / "inductor"
    from dflash_doctor.cache.restore import restore_snapshot

    # the CLI made it for the build on this machine (Triton or not): restored for that build
    restore_snapshot(cache_env["snapshots"] / "from-ro.tar.zst", {"inductor": restored}, live_build())
    assert tree_digests(restored) == digests
    assert not (cache / ".dflash-doctor.json").exists()  # no marker could be written: none claimed


def test_b6_the_snapshot_says_the_read_only_cache_got_no_marker(
    tmp_path: Path, cache_env: dict[str, Path]
) -> None:
    make_tree(cache_env["inductor"], files=12)
    found = _in_mount_namespace(
        tmp_path,
        _CLI_IN_CHILD
        + """
read_only(T / "caches" / "inductor")
print(json.dumps(cli("cache", "snapshot", "--name", "s")))
""",
    )
    assert found["code"] == 0, found["err"]  # was 2: the marker's write failed, read-only file system
    assert "is read-only: archived, no build marker written" in str(found["out"])


def test_b6_a_restore_into_a_read_only_cache_names_it_read_only(
    tmp_path: Path, cache_env: dict[str, Path]
) -> None:
    archive, _ = snapshot_of(tmp_path, build=live_build())
    old = make_tree(cache_env["inductor"], files=3, seed=9)
    found = _in_mount_namespace(
        tmp_path,
        _CLI_IN_CHILD
        + f"""
read_only(T / "caches")
print(json.dumps(cli("cache", "restore", {str(archive)!r})))
""",
    )
    assert found["code"] == 2
    err = str(found["err"])
    assert f"{cache_env['inductor']} is on a read-only file system" in err  # was: "the cache lock ... cannot
    assert "a folder on a writable disk" in err  # be opened", with a hint to remove a lock that cannot exist
    assert tree_digests(cache_env["inductor"]) == old


def test_b7_a_read_only_store_serves_restore_and_list(tmp_path: Path, cache_env: dict[str, Path]) -> None:
    digests = make_tree(cache_env["inductor"], files=12)
    assert run(["cache", "snapshot", "--name", "prebuilt"]) == 0
    shutil.rmtree(cache_env["inductor"])
    found = _in_mount_namespace(
        tmp_path,
        _CLI_IN_CHILD
        + f"""
read_only(Path({str(cache_env["snapshots"])!r}))
print(json.dumps({{"restore": cli("cache", "restore", "prebuilt"), "list": cli("cache", "list")}}))
""",
    )
    restored, listed = found["restore"], found["list"]
    assert isinstance(restored, dict) and isinstance(listed, dict)
    assert restored["code"] == 0, restored["err"]  # was 2: the store lock could not be created
    assert tree_digests(cache_env["inductor"]) == digests
    assert listed["code"] == 0 and "prebuilt" in listed["out"]


def test_b7_snapshot_and_prune_name_a_read_only_store(tmp_path: Path, cache_env: dict[str, Path]) -> None:
    make_tree(cache_env["inductor"], files=12)
    assert run(["cache", "snapshot", "--name", "prebuilt"]) == 0
    store = disk_state(cache_env["snapshots"])
    (tmp_path / "out").mkdir()
    found = _in_mount_namespace(
        tmp_path,
        _CLI_IN_CHILD
        + f"""
read_only(Path({str(cache_env["snapshots"])!r}))
print(json.dumps({{
    "snapshot": cli("cache", "snapshot", "--name", "new"),
    "out": cli("cache", "snapshot", "--name", "new", "--out", str(T / "out")),
    "prune": cli("cache", "prune", "--keep", "0"),
    "dry": cli("cache", "prune", "--keep", "0", "--dry-run"),
}}))
""",
    )
    snapshot, out, prune, dry = (found[k] for k in ("snapshot", "out", "prune", "dry"))
    assert isinstance(snapshot, dict) and isinstance(out, dict) and isinstance(prune, dict)
    assert isinstance(dry, dict)
    assert snapshot["code"] == 2 and "is on a read-only file system: a snapshot cannot be written" in str(
        snapshot["err"]
    )
    assert "--out" in str(snapshot["err"])  # the hint says what to do
    assert out["code"] == 0, out["err"]  # a snapshot elsewhere does not need the store's lock
    assert (tmp_path / "out" / "new.tar.zst").is_file()
    assert prune["code"] == 2 and "read-only file system: prune cannot change it" in str(prune["err"])
    assert dry["code"] == 0 and "would delete prebuilt" in str(dry["out"])
    assert disk_state(cache_env["snapshots"]) == store


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
def test_b5_no_room_for_a_backup_record_after_the_swap_leaves_no_staging_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    """After the first root is swapped, the previous cache's ownership record finds no inode: the code
    before stopped there with the error, the second root's verified staging copy left on the full disk.
    Now every root is swapped (a record is what recovery gives later, as after a kill), no staging folder
    stays, and the journal stays until the next run writes the records."""
    from dflash_doctor.cache import backups
    from dflash_doctor.cache.manifest import BACKUP_OWNER_NAME
    from dflash_doctor.cache.restore import restore_snapshot
    from tests.cache.test_attacks import _two_root_setup

    archive, targets, _, new = _two_root_setup(tmp_path)
    real = backups.write_atomic_at

    def no_inode_for_records(folder: int, name: str, data: bytes, mode: int = 0o600) -> None:
        if name == BACKUP_OWNER_NAME:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(folder, name, data, mode)

    monkeypatch.setattr(backups, "write_atomic_at", no_inode_for_records)
    if not exchange:
        monkeypatch.setattr(fsops, "exchange_at", lambda *args: False)  # a filesystem without RENAME_EXCHANGE
    result = restore_snapshot(archive, targets, CPU_BUILD)
    run_folder = tmp_path / "run"
    assert {label: tree_digests(path) for label, path in targets.items()} == new  # both roots new
    assert not list(run_folder.glob(".*dflash-staging-*"))  # no verified copy left on the full disk
    assert sum("no space left for its ownership record" in line for line in result.left_alone) == 2
    assert not [line for line in result.left_alone if "not a backup this tool made" in line]
    assert journal_path(targets["inductor"]).exists()
    monkeypatch.undo()
    restore.recover_interrupted(targets["inductor"])  # the next run, with room again
    for label in targets:
        assert (result.backups[label] / BACKUP_OWNER_NAME).is_file(), label
    assert not journal_path(targets["inductor"]).exists()


def test_b7_cache_warm_names_a_read_only_store_before_it_compiles(
    tmp_path: Path, cache_env: dict[str, Path]
) -> None:
    cache_env["snapshots"].mkdir(parents=True)
    found = _in_mount_namespace(
        tmp_path,
        _CLI_IN_CHILD
        + f"""
from dflash_doctor.commands import cache as cache_command
started = []
cache_command.run_warm_child = lambda *args: started.append(args) or {{}}
read_only(Path({str(cache_env["snapshots"])!r}))
print(json.dumps({{**cli("cache", "warm"), "started": len(started)}}))
""",
    )
    assert found["code"] == 2 and found["started"] == 0  # was: compiled first, then refused at the lock
    assert "is on a read-only file system: `cache warm`'s snapshot" in str(found["err"])


# -- G3's lock folder without an account home (what docs/cache.md says of it)


@pytest.mark.parametrize("account", ["no password entry", "home missing"])
def test_g3_without_an_account_home_the_lock_folder_is_one_per_uid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, account: str
) -> None:
    """Was the home's own (one per home); one per uid since issue 58, R1 (tests/cache/test_attacks_58.py)."""
    import pwd

    from dflash_doctor import paths

    monkeypatch.delenv("DFLASH_DOCTOR_LOCK_DIR")
    monkeypatch.setattr(paths, "SHARED_LOCK_BASE", str(tmp_path / "tmp"))
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    real = pwd.getpwuid(os.getuid())
    if account == "no password entry":  # `docker run -u 1234`

        def no_entry(uid: int) -> pwd.struct_passwd:
            raise KeyError(uid)

        monkeypatch.setattr(pwd, "getpwuid", no_entry)
    else:
        missing = pwd.struct_passwd((*real[:5], str(tmp_path / "no-such-home"), real[6]))
        monkeypatch.setattr(pwd, "getpwuid", lambda uid: missing)
    assert paths.lock_root() == tmp_path / "tmp" / f"dflash-doctor-locks-{os.getuid()}"
    (tmp_path / "account").mkdir()
    present = pwd.struct_passwd((*real[:5], str(tmp_path / "account"), real[6]))
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: present)
    assert paths.lock_root() == tmp_path / "account" / ".cache" / "dflash-doctor" / "locks"  # every home's
