"""cache.* findings: each fires on a planted problem and stays quiet on a healthy cache."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dflash_doctor.cache.fingerprint import fingerprint_of
from dflash_doctor.cache.inspection import volatility
from dflash_doctor.cache.snapshot import take_snapshot
from dflash_doctor.context import CheckContext
from dflash_doctor.findings import Finding, Severity
from dflash_doctor.registry import run_checks
from tests.cache.helpers import make_tree
from tests.cache.layout_helpers import write_marker
from tests.conftest import env_for
from tests.fakeenv import FakeSite


@pytest.fixture
def torch_site(site: FakeSite) -> FakeSite:
    site.add_torch(version="2.13.0+cpu")
    return site


def cache_findings(site: FakeSite) -> dict[str, Finding]:
    runs = run_checks(CheckContext(env_for(site)), ["cache"])
    return {f.id: f for r in runs for f in r.findings}


@pytest.fixture
def persistent_dir() -> Iterator[Path]:
    """A folder outside the shared temp folder (pytest's tmp_path lives in /tmp)."""
    folder = Path(tempfile.mkdtemp(prefix=".dflash-doctor-test-", dir=Path.home()))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_volatility_is_judged_from_filesystem_and_place() -> None:
    assert volatility(Path("/data/cache"), "ext4", tempdir="/tmp") is None
    assert "tmpfs" in (volatility(Path("/data/cache"), "tmpfs", tempdir="/tmp") or "")
    assert "shared temp" in (volatility(Path("/tmp/torchinductor_ana"), "ext4", tempdir="/tmp") or "")


def test_cache_in_tmp_warns_with_managed_location(
    torch_site: FakeSite, cache_env: dict[str, Path], persistent_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(persistent_dir / "home"))
    make_tree(cache_env["inductor"], files=3)
    found = cache_findings(torch_site)
    assert found["cache.volatile"].severity is Severity.WARN
    remedy = found["cache.volatile"].remedy or ""
    assert remedy.startswith(
        f"export TORCHINDUCTOR_CACHE_DIR={persistent_dir / 'home' / 'cache' / 'inductor'}"
    )


def test_a_volatile_home_is_not_advised_as_the_cure(torch_site: FakeSite, cache_env: dict[str, Path]) -> None:
    """DFLASH_DOCTOR_HOME in /tmp (here: pytest's tmp_path): advising its cache folder would swap one
    volatile folder for another, so the remedy moves the home."""
    make_tree(cache_env["inductor"], files=3)
    remedy = cache_findings(torch_site)["cache.volatile"].remedy or ""
    assert remedy.startswith("export DFLASH_DOCTOR_HOME=") and str(cache_env["home"]) in remedy


def test_persistent_cache_location_is_ok(
    torch_site: FakeSite, cache_env: dict[str, Path], persistent_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(persistent_dir / "inductor"))
    make_tree(persistent_dir / "inductor", files=3)
    found = cache_findings(torch_site)
    assert "cache.volatile" not in found and found["cache.location"].severity is Severity.OK


def test_world_writable_cache_fails(torch_site: FakeSite, cache_env: dict[str, Path]) -> None:
    make_tree(cache_env["inductor"], files=3)
    found = cache_findings(torch_site)
    assert found["cache.permissions"].severity is Severity.OK and "cache.writable_by_others" not in found
    planted = next(p for p in cache_env["inductor"].rglob("*") if p.is_dir())
    planted.chmod(0o777)
    found = cache_findings(torch_site)
    assert found["cache.writable_by_others"].severity is Severity.FAIL
    assert found["cache.writable_by_others"].remedy == f"chmod -R go-w {cache_env['inductor']}"


def test_foreign_owned_cache_fails(
    torch_site: FakeSite, cache_env: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    make_tree(cache_env["inductor"], files=3)
    assert "cache.foreign_owner" not in cache_findings(torch_site)
    real_uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real_uid + 4242)  # as if another user had made it
    assert cache_findings(torch_site)["cache.foreign_owner"].severity is Severity.FAIL


def snapshot_in_store(site: FakeSite, cache_env: dict[str, Path], tmp_path: Path, name: str) -> Path:
    """A snapshot for this site's build in the (private) store, made from a tree elsewhere."""
    source = tmp_path / "elsewhere"
    make_tree(source, files=3)
    cache_env["snapshots"].mkdir(parents=True, mode=0o700, exist_ok=True)
    dest = cache_env["snapshots"] / f"{name}.tar.zst"
    return take_snapshot({"inductor": source}, fingerprint_of(env_for(site)), name, dest).path


def test_cold_cache_with_compatible_snapshot_warns_restore(
    torch_site: FakeSite, cache_env: dict[str, Path], tmp_path: Path
) -> None:
    snapshot_in_store(torch_site, cache_env, tmp_path, "good")
    found = cache_findings(torch_site)  # the cache folder does not exist: cold
    assert found["cache.cold"].severity is Severity.WARN
    assert found["cache.cold"].remedy == "dflash-doctor cache restore good"


def test_warm_cache_is_ok(torch_site: FakeSite, cache_env: dict[str, Path]) -> None:
    make_tree(cache_env["inductor"], files=3)
    write_marker(cache_env["inductor"], fingerprint_of(env_for(torch_site)), "test", None)
    found = cache_findings(torch_site)
    assert found["cache.warm"].severity is Severity.OK and "cache.cold" not in found


def test_cache_for_another_build_warns(torch_site: FakeSite, cache_env: dict[str, Path]) -> None:
    make_tree(cache_env["inductor"], files=3)
    other = dataclasses.replace(fingerprint_of(env_for(torch_site)), torch_version="2.11.0+cu130")
    write_marker(cache_env["inductor"], other, "test", None)
    found = cache_findings(torch_site)
    assert found["cache.cold"].severity is Severity.WARN
    assert "torch version 2.11.0+cu130" in found["cache.cold"].summary


def test_no_cache_yet_is_skipped(torch_site: FakeSite, cache_env: dict[str, Path]) -> None:
    found = cache_findings(torch_site)
    assert found["cache.empty"].severity is Severity.SKIP
    assert found["cache.permissions"].severity is Severity.SKIP


@pytest.mark.parametrize(
    ("mode", "finding", "severity"),
    [(0o1777, "cache.parent_shared", Severity.WARN), (0o777, "cache.parent_writable", Severity.FAIL)],
)
def test_a_parent_others_can_write_is_reported(
    torch_site: FakeSite, cache_env: dict[str, Path], mode: int, finding: str, severity: Severity
) -> None:
    """D19: the folder holding the cache decides who can rename it or plant names beside it."""
    make_tree(cache_env["inductor"], files=3)
    cache_env["inductor"].parent.chmod(0o700)
    found = cache_findings(torch_site)
    assert "cache.parent_shared" not in found and "cache.parent_writable" not in found
    cache_env["inductor"].parent.chmod(mode)
    found = cache_findings(torch_site)
    assert found[finding].severity is severity
    assert str(cache_env["inductor"].parent) in found[finding].summary


def test_a_store_others_can_write_fails(
    torch_site: FakeSite, cache_env: dict[str, Path], tmp_path: Path
) -> None:
    """D8: the snapshot store is checked like the cache."""
    snapshot_in_store(torch_site, cache_env, tmp_path, "s")
    found = cache_findings(torch_site)
    assert found["cache.store"].severity is Severity.OK and "cache.store_permissions" not in found
    cache_env["snapshots"].chmod(0o777)
    found = cache_findings(torch_site)
    assert found["cache.store_permissions"].severity is Severity.FAIL
    assert found["cache.store_permissions"].remedy == f"chmod go-w {cache_env['snapshots']}"


@pytest.mark.skipif(os.getuid() != 0, reason="making another user's file needs root (chown)")
def test_another_users_archive_in_the_store_fails(
    torch_site: FakeSite, cache_env: dict[str, Path], tmp_path: Path
) -> None:
    planted = snapshot_in_store(torch_site, cache_env, tmp_path, "theirs")
    os.chown(planted, 4242, 4242)
    found = cache_findings(torch_site)
    assert found["cache.store_untrusted"].severity is Severity.FAIL
    assert "cache.cold" not in found or "theirs" not in (found["cache.cold"].remedy or "")


def test_a_walk_started_beside_the_checks_reports_what_a_walk_in_place_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cache.*`'s starter walks the folders in a forked child while other checks run: the same counts, bytes
    and offending entries as the walk `inspect_folder` does itself; a walk for another user is not used."""
    from dflash_doctor.cache.inspection import StartedWalks, inspect_folder
    from dflash_doctor.env import forked

    monkeypatch.setattr(forked, "thread_count", lambda: 1)  # whatever the test runner started
    cache = tmp_path / "inductor"
    make_tree(cache, files=12)
    for planted in sorted(p for p in cache.rglob("*") if p.is_file())[:7]:
        planted.chmod(0o666)  # more than a report names (SAMPLE)
    walks = StartedWalks([cache, tmp_path / "not-there"])
    assert len(walks._jobs) == 1 and walks._jobs[str(cache)].children == 1  # a child, only for a folder
    beside, in_place = inspect_folder("inductor", cache, walks=walks), inspect_folder("inductor", cache)
    assert beside.to_json() == in_place.to_json()
    assert beside.unsafe_count == 7 and len(beside.unsafe_writable) == 5 and beside.files >= 12
    other_user = StartedWalks([cache], uid=os.getuid() + 4242)
    assert other_user.get(str(cache), os.getuid()) is None  # judged for someone else: walked again
    other_user.cancel()
    assert other_user._jobs == {}
