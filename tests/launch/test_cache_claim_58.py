"""Issue 58, TR1: the folder a launch compiles into is judged when it is used, not only by the gate's checks.

Another user creating the cache folder in a shared (1777) parent after the checks ran: the warm-up child (and so
the workers) must never be started into it, whether a restore was refused (the launch used to "compile cold"
there) or no snapshot was there to restore (it used to take the folder as it found it)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dflash_base.errors import DoctorError
from dflash_doctor.cache.fingerprint import BuildFingerprint
from dflash_doctor.cache.snapshot import take_snapshot
from dflash_doctor.launch import compile_cache
from tests.cache.helpers import make_tree
from tests.cache.second_user import OTHER_USER
from trainer.runspec.config_file import resolve_config_path

FINGERPRINT = BuildFingerprint("2.13.0+cpu", "cf30153c4c13", None, None, "3.11", None)
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="making another user's folder needs root (chown)")


@pytest.fixture
def launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DFLASH_DOCTOR_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setattr(compile_cache, "current_fingerprint", lambda env: FINGERPRINT)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    ran: list[list[str]] = []

    def child(command: list[str], environ: dict[str, str]) -> dict[str, Any]:
        ran.append(command)
        return {"first_call_seconds": 1.0, "counters": {"inductor": {"fxgraph_cache_miss": 1}}}

    monkeypatch.setattr(compile_cache, "run_warm_child", child)
    inductor = shared / "inductor"
    env = SimpleNamespace(interpreter=SimpleNamespace(executable=sys.executable))

    def prepare() -> compile_cache.CachePreparation:
        return compile_cache.prepare_compile_cache(
            env,  # type: ignore[arg-type]
            {"TORCHINDUCTOR_CACHE_DIR": str(inductor)},
            resolve_config_path("tiny-cpu"),
            "cpu",
        )

    return {"inductor": inductor, "ran": ran, "prepare": prepare, "home": tmp_path / "home"}


def _planted(inductor: Path) -> None:
    """What the other user did after the gate's checks: made the cache's folder, with a file of theirs in it."""
    make_tree(inductor, files=2)
    for path in (inductor, *inductor.rglob("*")):
        os.lchown(path, OTHER_USER, OTHER_USER)


@needs_root
def test_tr1_a_cache_folder_another_user_made_after_the_checks_is_never_compiled_into(
    launch: dict[str, Any],
) -> None:
    _planted(launch["inductor"])
    with pytest.raises(DoctorError, match=f"belongs to uid {OTHER_USER}"):
        launch["prepare"]()
    assert launch["ran"] == []  # no warm-up child, so no worker either


@needs_root
def test_tr1_a_refused_restore_does_not_fall_back_to_compiling_in_that_folder(
    launch: dict[str, Any], tmp_path: Path
) -> None:
    """A compatible snapshot is there: its restore is refused (the folder is not ours), and the old fallback
    compiled cold into the other user's folder."""
    source = tmp_path / "source"
    make_tree(source, files=3)
    store = launch["home"] / "cache" / "snapshots"
    store.mkdir(parents=True, mode=0o700)
    take_snapshot({"inductor": source}, FINGERPRINT, "snap", store / "snap.tar.zst")
    _planted(launch["inductor"])
    with pytest.raises(DoctorError, match=f"belongs to uid {OTHER_USER}"):
        launch["prepare"]()
    assert launch["ran"] == []


def test_tr1_a_cache_folder_others_can_write_is_never_compiled_into(launch: dict[str, Any]) -> None:
    make_tree(launch["inductor"], files=2)
    launch["inductor"].chmod(0o777)
    with pytest.raises(DoctorError, match="is writable by others"):
        launch["prepare"]()
    assert launch["ran"] == []


def test_tr1_an_absent_cache_folder_is_made_ours_before_the_child_starts(launch: dict[str, Any]) -> None:
    launch["prepare"]()
    info = launch["inductor"].lstat()
    assert launch["ran"] and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700


# -- issue 55: "restore a snapshot and adopt its warm-up records" has one home and one policy


def test_i55_records_that_cannot_be_kept_never_fail_a_launchs_restore(
    launch: dict[str, Any], tmp_path: Path
) -> None:
    """`train` restoring a cold cache: the records the snapshot carries cannot be written (the records file is
    a folder); the cache is restored and the launch goes on, saying so, as `cache restore` does (it used to
    fail the launch)."""
    from dflash_doctor.cache.warm_record import WarmRecords

    source = tmp_path / "source"
    digests = make_tree(source, files=3)
    carried = WarmRecords(tmp_path / "carried.json")
    carried.save("k" * 64, (), {f"inductor/{path}": (source / path).stat().st_size for path in digests})
    store = launch["home"] / "cache" / "snapshots"
    store.mkdir(parents=True, mode=0o700)
    take_snapshot({"inductor": source}, FINGERPRINT, "snap", store / "snap.tar.zst", records=carried)
    (launch["home"] / "cache" / "warm-records.json").mkdir()
    prep = launch["prepare"]()
    assert prep.action == "restored" and "warm-up records were not kept" in prep.detail
    assert launch["ran"]  # the warm-up then ran as for any restored cache without a record
