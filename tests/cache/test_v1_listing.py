"""A v1 archive (one zstd stream, no seek table) cut short is listed as damaged, with the reason and
the remedy, as a damaged v2 archive is; an intact one stays listed as restorable. The check walks the
frames' block headers (frames.walk_frames), it does not decompress the archive."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import zstandard

from dflash_doctor.cache.extract import read_manifest
from dflash_doctor.cache.fingerprint import BuildFingerprint
from dflash_doctor.cache.frames import walk_frames
from dflash_doctor.cache.manifest import ArchiveError
from dflash_doctor.cache.store import SnapshotStore
from dflash_doctor.cli import run
from tests.cache.helpers import CPU_BUILD, live_build, manifest_for, write_raw_archive

V1_SCHEMA = "dflash-doctor/cache-manifest/v1"


def v1_archive(dest: Path, stream: bool = True, build: BuildFingerprint = CPU_BUILD) -> Path:
    """A v1 snapshot of 2.4 MB of incompressible files (many zstd blocks)."""
    members = {f"inductor/ab/f{i}.so": random.Random(i).randbytes(60_000) for i in range(40)}
    manifest = manifest_for(members, build)
    manifest.schema = V1_SCHEMA
    return write_raw_archive(dest, manifest, list(members.items()), stream=stream)


def cut(source: Path, dest: Path, keep: int) -> Path:
    dest.write_bytes(source.read_bytes()[:keep])
    return dest


def private_store(tmp_path: Path) -> SnapshotStore:
    store = SnapshotStore(tmp_path / "store")
    store.root.mkdir(mode=0o700)
    return store


@pytest.mark.parametrize("stream", [True, False], ids=["stream-writer", "one-shot"])
@pytest.mark.parametrize("fraction", [0.5, 0.9, 0.99999])
def test_a_truncated_v1_archive_is_listed_damaged(tmp_path: Path, stream: bool, fraction: float) -> None:
    store = private_store(tmp_path)
    whole = v1_archive(store.path_for("whole"), stream)
    cut(whole, store.path_for("cut"), int(whole.stat().st_size * fraction))
    listed = {s.name: s for s in store.snapshots()}
    damaged = listed["cut"]
    assert damaged.damaged and damaged.manifest is None
    assert "truncated archive" in (damaged.error or "") and "cut short" in (damaged.error or "")
    assert damaged.incompatible_with(CPU_BUILD)[0].startswith("damaged: ")
    assert damaged.remedy is not None and damaged.remedy.startswith(f"rm -- {damaged.path}")
    assert [s.name for s in store.compatible(CPU_BUILD)] == ["whole"]


@pytest.mark.parametrize("stream", [True, False], ids=["stream-writer", "one-shot"])
def test_an_intact_v1_archive_is_not_damaged(tmp_path: Path, stream: bool) -> None:
    store = private_store(tmp_path)
    v1_archive(store.path_for("whole"), stream)
    (listed,) = store.snapshots()
    assert not listed.damaged and listed.error is None and listed.remedy is None
    assert listed.manifest is not None and listed.manifest.schema == V1_SCHEMA
    assert not listed.incompatible_with(CPU_BUILD)


def test_a_v1_stream_missing_a_whole_frame_is_truncated(tmp_path: Path) -> None:
    """Cut exactly between two frames, every frame left is whole: the sizes the frames declare show
    that they hold less than the manifest lists."""
    whole = v1_archive(tmp_path / "one.tar.zst", stream=False)
    tar = zstandard.ZstdDecompressor().decompress(whole.read_bytes())
    compressor = zstandard.ZstdCompressor()
    (tmp_path / "two.tar.zst").write_bytes(compressor.compress(tar[: len(tar) // 2]))
    with pytest.raises(ArchiveError, match="frames hold less than the manifest lists"):
        read_manifest(tmp_path / "two.tar.zst")


def test_bytes_after_the_last_frame_are_corrupt(tmp_path: Path) -> None:
    archive = v1_archive(tmp_path / "v1.tar.zst")
    archive.write_bytes(archive.read_bytes() + b"not a frame at all")
    with pytest.raises(ArchiveError, match="are not a zstd frame"):
        read_manifest(archive)


def test_walk_frames_reads_skippable_frames_and_declared_sizes(tmp_path: Path) -> None:
    data = b"kernel " * 50_000
    compressor = zstandard.ZstdCompressor()
    skippable = (0x184D2A53).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"12345"
    path = tmp_path / "frames.zst"
    path.write_bytes(compressor.compress(data) + skippable + compressor.compress(data[:999]))
    with open(path, "rb") as raw:
        assert walk_frames(raw, "frames") == len(data) + 999
    path.write_bytes(path.read_bytes()[: -len(compressor.compress(data[:999])) - 2])  # inside the skippable
    with open(path, "rb") as raw, pytest.raises(ArchiveError, match="truncated"):
        walk_frames(raw, "frames")


def test_cache_list_shows_the_damage_and_the_remedy(
    cache_env: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    store = SnapshotStore(cache_env["snapshots"])
    store.ensure()
    whole = v1_archive(store.path_for("whole"), build=live_build())
    damaged = cut(whole, store.path_for("cut"), whole.stat().st_size // 2)
    capsys.readouterr()
    assert run(["cache", "list", "--json"]) == 0
    listed = {s["name"]: s for s in json.loads(capsys.readouterr().out)["snapshots"]}
    assert "truncated archive" in listed["cut"]["damaged"] and not listed["cut"]["compatible"]
    assert listed["cut"]["remedy"].startswith(f"rm -- {damaged}")
    assert listed["whole"]["damaged"] is None and listed["whole"]["compatible"]
    assert run(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "no: damaged: " in out and f"fix: rm -- {damaged}\n" in out
