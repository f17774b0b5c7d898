"""The extracting pass itself: both of its paths (three threads, or the caller's alone) write the
same bytes and refuse the same archives, whatever the block size; reused buffers are never refilled
while a view of them is alive."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import zstandard

from dflash_doctor.cache import extract
from dflash_doctor.cache.extract import _Blocks, extract_verified
from dflash_doctor.cache.manifest import ArchiveError
from dflash_doctor.cache.snapshot import take_snapshot
from tests.cache.helpers import CPU_BUILD, make_tree, manifest_for, tree_digests, write_raw_archive


@pytest.mark.parametrize("threaded", [True, False])
@pytest.mark.parametrize("block", [700, 4096, 65_536])
def test_small_blocks_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threaded: bool, block: int
) -> None:
    """Members, headers and padding cut across blocks anywhere: the files come out whole."""
    source = tmp_path / "source"
    digests = make_tree(source, files=50, seed=4, size=30_000)
    archive = take_snapshot({"inductor": source}, CPU_BUILD, "s", tmp_path / "s.tar.zst").path
    monkeypatch.setattr(extract, "BLOCK_BYTES", block)
    monkeypatch.setattr(extract, "BATCH_BYTES", 3 * block)
    out = tmp_path / "out" / "inductor"
    out.mkdir(parents=True)
    extract_verified(archive, {"inductor": out}, threaded=threaded)
    assert tree_digests(out) == digests


@pytest.mark.parametrize("threaded", [True, False])
def test_both_paths_refuse_a_wrong_sha256(tmp_path: Path, threaded: bool) -> None:
    members = {f"inductor/d{i % 3}/f{i}.so": bytes([i]) * (i * 997) for i in range(40)}
    bad = dict(members)
    bad["inductor/d1/f7.so"] = b"x" * len(members["inductor/d1/f7.so"])
    archive = write_raw_archive(tmp_path / "bad.tar.zst", manifest_for(members), list(bad.items()))
    out = tmp_path / "out" / "inductor"
    out.mkdir(parents=True)
    with pytest.raises(ArchiveError, match=r"'inductor/d1/f7.so': sha256 .* does not match"):
        extract_verified(archive, {"inductor": out}, threaded=threaded)


def test_a_buffer_in_use_is_not_refilled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extract, "BLOCK_BYTES", 1000)
    data = bytes(range(256)) * 40
    blocks = _Blocks(io.BytesIO(zstandard.ZstdCompressor().compress(data)), "t")
    first = next(blocks)
    kept, first_bytes = first[100:200], bytes(first)  # a slice of the first block stays alive
    del first
    rest = [bytes(b) for b in blocks]  # the 10 later blocks, in buffers refilled once free
    assert first_bytes + b"".join(rest) == data
    assert bytes(kept) == first_bytes[100:200]  # never overwritten
    assert len(blocks._pool) <= 3  # the held buffer and two that took turns
