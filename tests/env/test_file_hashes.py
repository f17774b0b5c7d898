"""The hash cache: a warm run reads no bytes; any change to a file invalidates its digest; corruption is harmless."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from dflash_doctor.env.file_hashes import CACHE_DIR_ENV, HashCache, default_cache_path


@pytest.fixture
def cache_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    return default_cache_path()


def test_env_var_moves_the_cache(cache_file: Path, tmp_path: Path) -> None:
    assert cache_file == tmp_path / "cache" / "file-hashes.json"


def test_warm_run_hits_the_cache(cache_file: Path, tmp_path: Path) -> None:
    lib = tmp_path / "libx.so"
    lib.write_bytes(b"x" * 5000)
    cold = HashCache.load()
    assert cold.digest(str(lib)) == hashlib.sha256(b"x" * 5000).hexdigest()
    assert (cold.misses, cold.bytes_hashed) == (1, 5000)
    cold.save()
    warm = HashCache.load()
    assert warm.digest(str(lib)) == hashlib.sha256(b"x" * 5000).hexdigest()
    assert (warm.hits, warm.misses, warm.bytes_hashed) == (1, 0, 0)


def test_rewritten_file_is_hashed_again(cache_file: Path, tmp_path: Path) -> None:
    lib = tmp_path / "libx.so"
    lib.write_bytes(b"old!")
    cache = HashCache.load()
    cache.digest(str(lib))
    cache.save()
    # same size, and mtime forced back: inode/ctime still differ after pip's write-and-rename
    st = lib.stat()
    replacement = tmp_path / "libx.so.new"
    replacement.write_bytes(b"new!")
    os.replace(replacement, lib)
    os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = HashCache.load()
    assert again.digest(str(lib)) == hashlib.sha256(b"new!").hexdigest()
    assert again.misses == 1


@pytest.mark.parametrize("content", ["not json {", '{"schema": "other", "files": {}}', '{"schema": 1}', "[]"])
def test_corrupt_cache_is_treated_as_empty(cache_file: Path, tmp_path: Path, content: str) -> None:
    cache_file.parent.mkdir(parents=True)
    cache_file.write_text(content)
    lib = tmp_path / "libx.so"
    lib.write_bytes(b"abc")
    cache = HashCache.load()
    assert cache.digest(str(lib)) == hashlib.sha256(b"abc").hexdigest()
    cache.save()
    assert json.loads(cache_file.read_text())["schema"] == "dflash-doctor/file-hashes/v1"


def test_malformed_rows_are_dropped(cache_file: Path, tmp_path: Path) -> None:
    cache_file.parent.mkdir(parents=True)
    lib = tmp_path / "libx.so"
    lib.write_bytes(b"abc")
    rows = {str(lib): [1, 2, "three", 4, "0" * 64], "/other": [1, 2, 3]}
    cache_file.write_text(json.dumps({"schema": "dflash-doctor/file-hashes/v1", "files": rows}))
    assert HashCache.load().entries == {}


def test_save_is_atomic_and_leaves_no_temp_files(cache_file: Path, tmp_path: Path) -> None:
    lib = tmp_path / "libx.so"
    lib.write_bytes(b"abc")
    cache = HashCache.load()
    cache.digest(str(lib))
    cache.save()
    assert [p.name for p in cache_file.parent.iterdir()] == ["file-hashes.json"]


def test_unchanged_cache_is_not_rewritten(cache_file: Path) -> None:
    HashCache.load().save()
    assert not cache_file.exists()


def test_unreadable_file_has_no_digest(cache_file: Path, tmp_path: Path) -> None:
    assert HashCache.load().digest(str(tmp_path / "gone.so")) is None
