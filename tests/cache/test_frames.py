"""Framed archives: the writer's frames and seek table read back exactly, by us and by zstd itself;
a seek table that lies in any way is refused; archives without one (v1) still restore."""

from __future__ import annotations

import random
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import zstandard

from dflash_doctor.cache import frames
from dflash_doctor.cache.extract import extract_verified
from dflash_doctor.cache.folder_lock import LOCK_SUFFIX
from dflash_doctor.cache.frames import FrameBlocks, FramedWriter, read_seek_table, seek_table
from dflash_doctor.cache.manifest import ArchiveError
from dflash_doctor.cache.restore import restore_snapshot
from dflash_doctor.cache.snapshot import take_snapshot
from tests.cache.helpers import CPU_BUILD, make_tree, manifest_for, tree_digests, write_raw_archive


def framed(path: Path, data: bytes, monkeypatch: pytest.MonkeyPatch, frame: int = 1000) -> Path:
    monkeypatch.setattr(frames, "FRAME_BYTES", frame)
    rng = random.Random(1)
    with open(path, "wb") as out, FramedWriter(out, threads=2) as writer:
        pos = 0
        while pos < len(data):  # written in odd pieces, as tarfile does
            step = rng.randint(1, 3 * frame)
            writer.write(data[pos : pos + step])
            pos += step
        writer.close()
    return path


def frames_of(path: Path) -> list[bytes]:
    with open(path, "rb") as raw:
        entries = read_seek_table(raw, str(path))
        assert entries is not None
        return list(FrameBlocks(raw, entries, str(path)))


DATA = random.Random(0).randbytes(30_000) + bytes(20_000) + b"kernel " * 3000


def test_frames_read_back_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = framed(tmp_path / "a.zst", DATA, monkeypatch)
    blocks = frames_of(archive)
    assert b"".join(blocks) == DATA
    assert [len(b) for b in blocks[:-1]] == [1000] * (len(blocks) - 1)
    reader = zstandard.ZstdDecompressor().stream_reader(archive.read_bytes(), read_across_frames=True)
    assert reader.read() == DATA  # one ordinary zstd stream: the seek table is a skippable frame


@pytest.mark.skipif(shutil.which("zstd") is None, reason="no zstd command here")
def test_zstd_and_tar_read_a_snapshot(tmp_path: Path) -> None:
    source = tmp_path / "source"
    make_tree(source, files=30, seed=9, size=200_000)
    archive = take_snapshot({"inductor": source}, CPU_BUILD, "s", tmp_path / "s.tar.zst").path
    with open(archive, "rb") as raw:
        assert len(read_seek_table(raw, "s") or []) > 1  # several frames
    listing = subprocess.run(
        f"zstd -dc {archive} | tar -t", shell=True, check=True, capture_output=True, text=True
    ).stdout.split()
    assert listing[0] == "MANIFEST.json" and len(listing) == 31


def rewrite_table(archive: Path, entries: list[tuple[int, int]], descriptor: int = 0) -> None:
    """Replace the archive's seek table with these entries (the frames themselves unchanged)."""
    data = archive.read_bytes()
    with open(archive, "rb") as raw:
        old = read_seek_table(raw, "x")
    assert old is not None
    body_end = sum(c for c, _ in old)
    table = bytearray(seek_table(entries))
    table[-5] = descriptor
    archive.write_bytes(data[:body_end] + bytes(table))


def lying_tables(old: list[tuple[int, int]]) -> dict[str, tuple[list[tuple[int, int]], str]]:
    (c0, d0), (c1, d1) = old[0], old[1]
    return {
        "short of the file": (old[:-1], "do not cover the file"),
        "two frames as one": ([(c0 + c1, d0 + d1), *old[2:]], "the seek table says"),
        "wrong decompressed size": ([(c0, d0 + 1), *old[1:]], "the seek table says"),
        "split inside a frame": ([(c0 - 5, d0), (c1 + 5, d1), *old[2:]], "corrupt archive"),
        "huge frame": ([(c0, 1 << 40), *old[1:]], "over the"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "short of the file",
        "two frames as one",
        "wrong decompressed size",
        "split inside a frame",
        "huge frame",
    ],
)
def test_a_lying_seek_table_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    archive = framed(tmp_path / "a.zst", DATA, monkeypatch)
    with open(archive, "rb") as raw:
        old = read_seek_table(raw, "x")
    assert old is not None
    entries, expect = lying_tables(old)[case]
    if case == "huge frame":
        entries = [(c, min(d, 0xFFFFFFFF)) for c, d in entries]
    rewrite_table(archive, entries)
    with pytest.raises(ArchiveError, match=expect):
        frames_of(archive)


def test_reserved_descriptor_bits_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = framed(tmp_path / "a.zst", DATA, monkeypatch)
    with open(archive, "rb") as raw:
        old = read_seek_table(raw, "x")
    assert old is not None
    rewrite_table(archive, old, descriptor=0x04)
    with pytest.raises(ArchiveError, match="reserved bits"):
        frames_of(archive)


def test_a_skippable_frame_listed_as_data_is_refused(tmp_path: Path) -> None:
    hidden = struct.pack("<II", 0x184D2A50, 4) + b"evil"
    frame = zstandard.ZstdCompressor().compress(b"x" * 100)
    archive = tmp_path / "a.zst"
    archive.write_bytes(hidden + frame + seek_table([(len(hidden), 0), (len(frame), 100)]))
    with pytest.raises(ArchiveError, match="not a zstd frame"):
        frames_of(archive)


def test_a_damaged_frame_is_refused_on_restore(tmp_path: Path) -> None:
    source = tmp_path / "source"
    make_tree(source, files=40, seed=5, size=100_000)
    archive = take_snapshot({"inductor": source}, CPU_BUILD, "s", tmp_path / "s.tar.zst").path
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    archive.write_bytes(bytes(data))
    target = tmp_path / "caches" / "inductor"
    before = make_tree(target, files=5, seed=6)
    with pytest.raises(ArchiveError):
        restore_snapshot(archive, {"inductor": target}, CPU_BUILD)
    assert tree_digests(target) == before
    beside = sorted(p.name for p in target.parent.iterdir() if not p.name.endswith(LOCK_SUFFIX))
    assert beside == ["inductor"]  # the folder's lock (folder_lock.py) stays; nothing else


@pytest.mark.parametrize("threaded", [True, False])
def test_a_v1_single_stream_archive_still_restores(tmp_path: Path, threaded: bool) -> None:
    """Archives written before frames: one zstd stream, no seek table, a v1 manifest."""
    members = {f"inductor/ab/f{i}.py": f"kernel {i}\n".encode() * (i + 1) for i in range(20)}
    manifest = manifest_for(members)
    manifest.schema = "dflash-doctor/cache-manifest/v1"
    archive = write_raw_archive(tmp_path / "v1.tar.zst", manifest, list(members.items()))
    with open(archive, "rb") as raw:
        assert read_seek_table(raw, "v1") is None
    out = tmp_path / "out" / "inductor"
    out.mkdir(parents=True)
    assert extract_verified(archive, {"inductor": out}, threaded=threaded).schema.endswith("/v1")
    assert all((out.parent / name).read_bytes() == data for name, data in members.items())
