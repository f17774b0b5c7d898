"""`dflash-doctor cache ...` end to end through the CLI entry point, on synthetic caches."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dflash_doctor.cli import run
from tests.cache.helpers import make_tree, tree_digests
from tests.disk_fixtures import small_disk  # noqa: F401  (fixture)


def json_of(capsys: pytest.CaptureFixture[str], argv: list[str], code: int = 0) -> dict:
    capsys.readouterr()
    assert run(argv) == code
    return json.loads(capsys.readouterr().out)


def test_snapshot_list_restore_prune(cache_env: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    cache = cache_env["inductor"]
    original = make_tree(cache, files=20)
    made = json_of(capsys, ["cache", "snapshot", "--name", "first", "--json"])
    assert made["files"] == 20 and Path(made["path"]).is_file()

    listed = json_of(capsys, ["cache", "list", "--json"])
    assert [s["name"] for s in listed["snapshots"]] == ["first"] and listed["snapshots"][0]["compatible"]

    shutil.rmtree(cache)
    restored = json_of(capsys, ["cache", "restore", "first", "--json"])
    assert restored["backups"] == {} and tree_digests(cache) == original

    status = json_of(capsys, ["cache", "status", "--json"], code=0)
    assert status["warmth"]["state"] == "warm"
    assert {f["id"] for f in status["findings"]} >= {"cache.warm", "cache.permissions"}

    json_of(capsys, ["cache", "snapshot", "--name", "second", "--json"])
    pruned = json_of(capsys, ["cache", "prune", "--keep", "1", "--json"])
    assert pruned["removed"] == ["first"]


def test_restore_keeps_previous_cache_as_backup(
    cache_env: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    cache = cache_env["inductor"]
    snapped = make_tree(cache, files=5, seed=1)
    assert run(["cache", "snapshot", "--name", "one"]) == 0
    shutil.rmtree(cache)
    newer = make_tree(cache, files=5, seed=2)
    restored = json_of(capsys, ["cache", "restore", "one", "--json"])
    assert tree_digests(cache) == snapped
    assert tree_digests(Path(restored["backups"]["inductor"])) == newer


def test_bad_input_exits_2_with_a_message(
    cache_env: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["cache", "restore", "nope"]) == 2
    assert "no snapshot named 'nope'" in capsys.readouterr().err
    assert run(["cache", "snapshot"]) == 2  # nothing to snapshot
    assert "nothing to snapshot" in capsys.readouterr().err
    assert run(["cache", "snapshot", "--name", "../evil"]) == 2
    assert run(["cache", "prune"]) == 2
    assert run(["cache", "prune", "--older-than", "soon"]) == 2
    assert run(["cache", "warm", "--heads", "3", "--kv-heads", "2"]) == 2


def test_hostile_archive_by_path_exits_2(
    cache_env: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = cache_env["inductor"]
    before = make_tree(cache, files=4)
    bad = tmp_path / "bad.tar.zst"
    bad.write_bytes(b"\x28\xb5\x2f\xfd garbage")
    assert run(["cache", "restore", str(bad)]) == 2
    assert "truncated or corrupt" in capsys.readouterr().err
    assert tree_digests(cache) == before


def test_snapshot_out_on_a_full_disk_names_the_archive(
    cache_env: dict[str, Path],
    small_disk,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    make_tree(cache_env["inductor"], files=40, size=20000)  # 800 kB that zstd cannot shrink much
    disk = small_disk(64)
    assert run(["cache", "snapshot", "--name", "big", "--out", str(disk)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"no space left on the device for {disk / 'big.tar.zst'}" in err and "a file" not in err
    assert list(disk.iterdir()) == []  # no partial archive left
