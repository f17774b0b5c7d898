"""A file removed from the cache while a snapshot reads it (a compiler's temp file renamed into place, another
process pruning): left out when it went before it was looked at, a named refusal (ArchiveError) once the
snapshot had counted on it; never a bare FileNotFoundError, which after a training run was a crash of the
launcher instead of `no snapshot: <why>` in its record."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from dflash_doctor.cache import archive
from dflash_doctor.cache.archive import collect_files, hash_files, write_archive
from dflash_doctor.cache.manifest import ArchiveError, CacheManifest
from tests.cache.helpers import CPU_BUILD, make_tree


def test_a_file_removed_between_the_listing_and_its_stat_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "source"
    make_tree(source, files=6)
    victim = next(p for p in sorted(source.rglob("*")) if p.is_file())
    listed = os.scandir

    def listing_then_removal(folder: str) -> contextlib.nullcontext[list[os.DirEntry[str]]]:
        with listed(folder) as found:
            entries = list(found)
        if any(entry.path == str(victim) for entry in entries):
            victim.unlink()  # gone after the listing, before the walk asks for its size
        return contextlib.nullcontext(entries)

    monkeypatch.setattr(archive.os, "scandir", listing_then_removal)
    files, skipped = collect_files({"inductor": source})
    monkeypatch.undo()
    paths = {f.path for f in files}
    assert str(victim) not in paths and skipped == []
    assert len(files) == 5


def test_a_file_removed_before_it_is_hashed_is_a_named_refusal(tmp_path: Path) -> None:
    source = tmp_path / "source"
    make_tree(source, files=4)
    files, _ = collect_files({"inductor": source})
    Path(files[1].path).unlink()
    with pytest.raises(ArchiveError, match="changed while the snapshot") as refused:
        hash_files(files, threads=2)
    assert files[1].path in refused.value.message


def test_a_file_removed_before_it_is_archived_is_a_named_refusal(tmp_path: Path) -> None:
    source = tmp_path / "source"
    make_tree(source, files=4)
    files, _ = collect_files({"inductor": source})
    manifest = CacheManifest("x", 1.0, CPU_BUILD, {"inductor": str(source)}, hash_files(files))
    Path(files[-1].path).unlink()
    with pytest.raises(ArchiveError, match="changed while the snapshot") as refused:
        write_archive(tmp_path / "x.tar.zst", manifest, files)
    assert files[-1].path in refused.value.message
    assert not (tmp_path / "x.tar.zst").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["source"]  # no partial archive left beside it
