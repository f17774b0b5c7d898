"""More hostile archives, aimed at our own tar reader: tar extensions we do not accept, damaged
headers, a stream without its end, a file where the cache folder belongs. Each is refused with a
message and leaves everything as it was (the same check as test_hostile)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
import zstandard

from dflash_doctor.cache.manifest import MANIFEST_MEMBER
from tests.cache.helpers import make_tree, manifest_for
from tests.cache.test_hostile import GOOD, assert_refused


@pytest.fixture
def victim(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    target = tmp_path / "caches" / "inductor"
    return target, make_tree(target, files=12, seed=7)


def tar_bytes(members: dict[str, bytes], manifest: bytes, fmt: int = tarfile.PAX_FORMAT, **extra) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt, **extra) as tar:
        for name, data in {MANIFEST_MEMBER: manifest, **members}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def without_end(raw: bytes) -> bytes:
    """The tar stream with its end-of-archive blocks cut away (every member still whole)."""
    whole = raw.rstrip(b"\0")
    return whole + bytes(-len(whole) % 512)


def zst(path: Path, raw: bytes) -> Path:
    path.write_bytes(zstandard.ZstdCompressor().compress(raw))
    return path


def test_global_pax_header_is_refused(tmp_path: Path, victim: tuple[Path, dict[str, str]]) -> None:
    target, before = victim
    head = without_end(tar_bytes({}, manifest_for(GOOD).to_bytes()))
    buffer = io.BytesIO()  # after the manifest: a global pax header, then the good member
    with tarfile.open(fileobj=buffer, mode="w", pax_headers={"path": "inductor/../../evil.py"}) as tar:
        for name, data in GOOD.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    archive = zst(tmp_path / "global.tar.zst", head + buffer.getvalue())
    assert_refused(tmp_path, archive, target, before, "unsupported member type 'g'")


def test_sparse_member_is_refused(tmp_path: Path, victim: tuple[Path, dict[str, str]]) -> None:
    target, before = victim
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        raw = manifest_for(GOOD).to_bytes()
        info = tarfile.TarInfo(MANIFEST_MEMBER)
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
        name, data = next(iter(GOOD.items()))
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0"}
        tar.addfile(info, io.BytesIO(data))
    archive = zst(tmp_path / "sparse.tar.zst", buffer.getvalue())
    assert_refused(tmp_path, archive, target, before, "unsupported member type")


def test_file_in_place_of_the_cache_folder_is_refused(
    tmp_path: Path, victim: tuple[Path, dict[str, str]]
) -> None:
    target, before = victim
    members = {"inductor": b"not a folder"}
    archive = zst(tmp_path / "root.tar.zst", tar_bytes(members, manifest_for(members).to_bytes()))
    assert_refused(tmp_path, archive, target, before, "where the cache folder itself belongs")


def test_damaged_header_is_refused(tmp_path: Path, victim: tuple[Path, dict[str, str]]) -> None:
    target, before = victim
    raw = bytearray(tar_bytes(GOOD, manifest_for(GOOD).to_bytes()))
    manifest_size = len(manifest_for(GOOD).to_bytes())
    second_header = 512 + manifest_size + (-manifest_size % 512)
    raw[second_header + 10] ^= 0x20  # one letter of the member's name changes case
    archive = zst(tmp_path / "damaged.tar.zst", bytes(raw))
    assert_refused(tmp_path, archive, target, before, "bad checksum")


def test_stream_without_end_marker_is_truncated(tmp_path: Path, victim: tuple[Path, dict[str, str]]) -> None:
    target, before = victim
    raw = without_end(tar_bytes(GOOD, manifest_for(GOOD).to_bytes()))
    archive = zst(tmp_path / "noend.tar.zst", raw)
    assert_refused(tmp_path, archive, target, before, "truncated")
