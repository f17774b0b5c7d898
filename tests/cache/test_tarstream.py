"""Our tar reader against Python's tarfile: same members, same bytes, whatever the format and however
the decompressed stream is cut into blocks; corrupt and truncated streams are refused."""

from __future__ import annotations

import io
import random
import tarfile

import pytest

from dflash_doctor.cache.manifest import ArchiveError
from dflash_doctor.cache.tarstream import TarReader, _number

NAMES = [
    "inductor/ab/cshort.py",
    "inductor/" + "d" * 90 + "/" + "f" * 60 + ".so",  # over 100 characters: ustar prefix or pax path
    "inductor/" + "x/" * 80 + "deep.cpp",  # over 155+100: pax path or GNU long name only
    "inductor/ünïcödé/κ.py",
    "inductor/empty",
    "inductor/exact512",
    "triton/0/abc/kernel.cubin",
]


def build_tar(fmt: int, seed: int = 0) -> tuple[bytes, list[tuple[str, int, bytes]]]:
    """A tar in format `fmt`; returns it and the (name, typeflag, data) tarfile reads back."""
    rng = random.Random(seed)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        folder = tarfile.TarInfo("inductor/folder")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        for name in NAMES:
            if fmt != tarfile.PAX_FORMAT and not name.isascii():
                continue
            if fmt == tarfile.USTAR_FORMAT and len(name) > 250:
                continue
            size = {"inductor/empty": 0, "inductor/exact512": 512}.get(name, rng.randint(1, 40_000))
            data = rng.randbytes(size)
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = size, 1_700_000_000, 0o644
            tar.addfile(info, io.BytesIO(data))
    raw = buffer.getvalue()
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        expected = [
            (m.name, ord(m.type), tar.extractfile(m).read() if m.isreg() else b"")  # type: ignore[union-attr]
            for m in tar.getmembers()
        ]
    return raw, expected


def cut(raw: bytes, rng: random.Random | None) -> list[bytes]:
    if rng is None:
        return [raw]
    blocks, pos = [], 0
    while pos < len(raw):
        step = rng.choice([1, 7, 100, 511, 512, 513, 3000, 70_000])
        blocks.append(raw[pos : pos + step])
        pos += step
    return blocks


def read_all(blocks: list[bytes], contiguous_first: bool = True) -> list[tuple[str, int, bytes]]:
    reader = TarReader(iter(blocks), "test.tar")
    found = []
    while (member := reader.next_member()) is not None:
        if member.is_regular:
            view = reader.contiguous_data(member) if contiguous_first else None
            data = bytes(view) if view is not None else b"".join(bytes(v) for v in reader.data_views(member))
        else:
            reader.skip_data(member)
            data = b""
        found.append((member.name, member.type, data))
    return found


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
@pytest.mark.parametrize("split", [None, 1, 2, 3])
def test_same_members_as_tarfile(fmt: int, split: int | None) -> None:
    raw, expected = build_tar(fmt, seed=split or 0)
    blocks = cut(raw, None if split is None else random.Random(split))
    assert read_all(blocks) == expected
    assert read_all(blocks, contiguous_first=False) == expected


def test_base256_and_octal_numbers() -> None:
    assert _number(b"0000644\0", "mode", "t") == 0o644
    assert _number(b"  17 \0\0\0", "size", "t") == 0o17
    assert _number(b"\x80" + (9 << 30).to_bytes(11, "big"), "size", "t") == 9 << 30
    assert _number(b"\xff" * 12, "size", "t") == -1
    with pytest.raises(ArchiveError, match="bad size field"):
        _number(b"12x4\0", "size", "t")


def test_bad_checksum_is_refused() -> None:
    raw, _ = build_tar(tarfile.PAX_FORMAT)
    damaged = bytearray(raw)
    damaged[0] ^= 0x01  # first byte of the first name: the stored checksum no longer matches
    with pytest.raises(ArchiveError, match="bad checksum"):
        read_all([bytes(damaged)])


def test_missing_end_marker_is_truncated() -> None:
    raw, _ = build_tar(tarfile.PAX_FORMAT)
    end = raw.rstrip(b"\0")
    end = end[: len(end) + (-len(end) % 512)]  # every member whole, no end-of-archive blocks
    with pytest.raises(ArchiveError, match="truncated"):
        read_all([end])
    with pytest.raises(ArchiveError, match="truncated"):
        read_all([raw[: len(raw) // 2]])  # inside a member


def test_checksum_shortcut_is_exact() -> None:
    """`_check_sum` computes the byte sum from adler32 and a mod-255 residue: it must accept exactly
    the plain sum (or tarfile's signed variant) and nothing else, for any header bytes."""
    from dflash_doctor.cache.tarstream import _check_sum

    rng = random.Random(5)
    for trial in range(3000):
        header = bytearray(
            rng.randbytes(512) if trial % 3 else bytes(rng.choice([0, 255]) for _ in range(512))
        )
        header[148:156] = b"        "
        plain = sum(header)
        signed = plain - 256 * sum(1 for i, b in enumerate(header) if b > 127 and not 148 <= i < 156)
        for stored in (plain, signed, plain + 1, plain - 1, plain - 65521, plain + 65521, plain + 2 * 65521):
            if not 0 <= stored <= 0o7777777:
                continue
            header[148:156] = b"%07o\0" % stored
            if stored in (plain, signed):
                _check_sum(bytes(header), "t")
            else:
                with pytest.raises(ArchiveError, match="bad checksum"):
                    _check_sum(bytes(header), "t")


def test_snapshot_headers_are_tarfiles() -> None:
    """archive.tar_header builds plain ustar headers itself: byte for byte tarfile's PAX-format ones,
    and tarfile's own for what does not fit ustar."""
    from dflash_doctor.cache.archive import tar_header

    rng = random.Random(8)
    names = [
        "MANIFEST.json",
        "inductor/ab/c.py",
        "x" * 100,
        "x" * 101,
        "inductor/ü.py",
        "inductor/" + "d/" * 60 + "f",
    ]
    for name in names + [f"inductor/{rng.randbytes(20).hex()}/f{i}.so" for i in range(50)]:
        size = rng.choice([0, 1, 511, 512, 513, rng.randint(0, 1 << 34)])
        mode = rng.choice([0o644, 0o755, 0o600, 0o4755])
        mtime = rng.choice([0, 1_700_000_000.7, 2**33 + 0.5, -5.0, 8**11 + 3])
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime, info.type = size, mode, int(mtime), tarfile.REGTYPE
        assert tar_header(name, size, mode, mtime) == info.tobuf(
            tarfile.PAX_FORMAT, "utf-8", "surrogateescape"
        )
