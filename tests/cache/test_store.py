"""Locations, fingerprints, names, list and prune: the pure logic, without torch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dflash_base.errors import DoctorError
from dflash_doctor.cache.fingerprint import fingerprint_of, incompatibilities
from dflash_doctor.cache.locations import resolve_locations
from dflash_doctor.cache.snapshot import take_snapshot
from dflash_doctor.cache.store import SnapshotStore, check_name, choose_prunable, default_name, parse_duration
from tests.cache.helpers import CPU_BUILD, make_tree
from tests.conftest import env_for
from tests.fakeenv import FakeSite


def test_default_locations_follow_torch() -> None:
    where = resolve_locations({}, tempdir="/tmp", user="ana", home="/home/ana")
    assert where.inductor == Path("/tmp/torchinductor_ana") and where.inductor_source == "default"
    assert where.triton is None  # Triton kernels live in inductor/triton/<device>
    assert where.triton_user == Path("/home/ana/.triton/cache")
    assert where.roots() == {"inductor": Path("/tmp/torchinductor_ana")}


def test_variables_move_the_caches() -> None:
    where = resolve_locations(
        {"TORCHINDUCTOR_CACHE_DIR": "/data/ind", "TRITON_CACHE_DIR": "/data/tri"}, user="ana"
    )
    assert where.inductor == Path("/data/ind") and where.inductor_source == "TORCHINDUCTOR_CACHE_DIR"
    assert where.roots() == {"inductor": Path("/data/ind"), "triton": Path("/data/tri")}


def test_fingerprint_from_static_environment(site: FakeSite) -> None:
    site.add_torch(version="2.11.0+cu130", cuda="13.0", git="70d99e998b4955e0049d13a98d77ae1b14db1f45")
    site.add_dist("triton", "3.5.0")
    fp = fingerprint_of(env_for(site), ("NVIDIA H200",))
    assert (fp.torch_version, fp.cuda, fp.triton_version, fp.python) == (
        "2.11.0+cu130",
        "13.0",
        "3.5.0",
        "3.11",
    )
    assert fp.torch_git == "70d99e998b4955e0049d13a98d77ae1b14db1f45"


def test_incompatibilities_name_each_difference() -> None:
    h200 = dataclasses.replace(CPU_BUILD, gpu_names=("NVIDIA H200",))
    assert incompatibilities(h200, h200) == []
    other_gpu = dataclasses.replace(h200, gpu_names=("NVIDIA H100 80GB HBM3",))
    assert incompatibilities(h200, other_gpu) == ["GPU NVIDIA H200 != NVIDIA H100 80GB HBM3 here"]
    rebuilt = dataclasses.replace(h200, torch_git="1" * 40)
    assert "torch git commit" in incompatibilities(h200, rebuilt)[0]
    assert (
        incompatibilities(h200, dataclasses.replace(h200, gpu_names=None)) == []
    )  # unknown GPUs: no verdict
    assert incompatibilities(CPU_BUILD, h200) == []  # a CPU cache still serves CPU kernels


def test_names_and_durations() -> None:
    assert default_name(dataclasses.replace(CPU_BUILD, gpu_names=("NVIDIA H200",)), 0).startswith(
        "torch2.13.0+cpu-h200-"
    )
    assert check_name("ok-name_1.2") == "ok-name_1.2"
    for bad in ("../x", "a/b", "", ".hidden", "x.tar.zst"):
        with pytest.raises(DoctorError):
            check_name(bad)
    assert parse_duration("7d") == 7 * 86400 and parse_duration("90s") == 90
    with pytest.raises(DoctorError):
        parse_duration("soon")


def _store_with(tmp_path: Path, ages_days: list[float]) -> SnapshotStore:
    store = SnapshotStore(tmp_path / "snapshots")
    store.root.mkdir(parents=True)
    source = tmp_path / "src"
    make_tree(source, files=3)
    now = 1_000_000_000.0
    for index, age in enumerate(ages_days):
        take_snapshot(
            {"inductor": source}, CPU_BUILD, f"s{index}", store.path_for(f"s{index}"), now=now - age * 86400
        )
    return store


def test_list_reads_manifests_newest_first(tmp_path: Path) -> None:
    store = _store_with(tmp_path, [3, 1, 2])
    (store.root / "broken.tar.zst").write_bytes(b"not an archive")
    listed = store.snapshots()
    assert [s.name for s in listed if s.manifest] == ["s1", "s2", "s0"]
    broken = next(s for s in listed if s.name == "broken")
    assert broken.manifest is None and broken.incompatible_with(CPU_BUILD)
    assert [s.name for s in store.compatible(CPU_BUILD)] == ["s1", "s2", "s0"]


def test_prune_keep_and_older_than(tmp_path: Path) -> None:
    snaps = _store_with(tmp_path, [10, 1, 5, 20]).snapshots()
    now = 1_000_000_000.0
    assert {s.name for s in choose_prunable(snaps, 2, None, now)} == {"s0", "s3"}
    assert {s.name for s in choose_prunable(snaps, None, 7 * 86400, now)} == {"s0", "s3"}
    assert {s.name for s in choose_prunable(snaps, 3, 7 * 86400, now)} == {"s3"}
    assert choose_prunable(snaps, None, None, now) == []


def test_restores_keep_only_the_newest_backups(tmp_path: Path) -> None:
    """Every restore keeps the previous cache as a backup; older backups beyond KEEP_BACKUPS go."""
    from dflash_doctor.cache.restore import KEEP_BACKUPS, restore_snapshot
    from dflash_doctor.cache.snapshot import take_snapshot
    from tests.cache.helpers import CPU_BUILD, make_tree, tree_digests

    source, target = tmp_path / "source", tmp_path / "cache" / "inductor"
    make_tree(source, files=5)
    archive = tmp_path / "snap.tar.zst"
    take_snapshot({"inductor": source}, CPU_BUILD, "snap", archive)
    make_tree(target, files=3, seed=1)
    for n in range(KEEP_BACKUPS + 2):
        restore_snapshot(archive, {"inductor": target}, CPU_BUILD, restore_id=f"20261130-0000{n:02d}-aaaaaa")
    backups = sorted(p.name for p in target.parent.glob("inductor.bak-*") if p.is_dir())
    assert len(backups) == KEEP_BACKUPS
    assert backups[-1].endswith(f"0000{KEEP_BACKUPS + 1:02d}-aaaaaa")
    assert tree_digests(target) == tree_digests(source)
