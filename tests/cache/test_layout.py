"""The content rule (layout.py): real caches are caches, folders of documents are not, whatever their names."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_doctor.cache.manifest import BACKUP_OWNER_NAME, MARKER_NAME
from tests.cache.layout_helpers import examine_path

LAYOUTS = Path(__file__).resolve().parent / "layouts"


def build_listing(listing: Path, root: Path) -> int:
    """The tree a `find . | sort` listing of a real cache describes (empty files); returns its file count."""
    lines = [line.strip()[2:] for line in listing.read_text().splitlines() if line.strip() not in ("", ".")]
    folders = {line.rpartition("/")[0] for line in lines if "/" in line}
    root.mkdir(parents=True)
    files = 0
    for line in lines:
        path = root / line
        if line in folders:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x")
            files += 1
    return files


@pytest.mark.parametrize("listing", sorted(p.name for p in LAYOUTS.glob("*.txt")))
def test_real_caches_are_caches(tmp_path: Path, listing: str) -> None:
    """Listings of real caches: torch 2.13 on CPU, torch 2.11 + Triton 3.6 on an H200 (Inductor alone,
    Inductor beside TRITON_CACHE_DIR, and that Triton folder)."""
    root = tmp_path / "cache"
    files = build_listing(LAYOUTS / listing, root)
    content = examine_path(root)
    assert content is not None and content.reason is None
    transient = sum(1 for p in root.glob("precompiled_headers/**/*") if p.is_file())
    transient += sum(1 for p in root.glob("locks/*") if p.is_file())
    assert content.files == files - transient


@pytest.mark.parametrize(
    ("entries", "named"),
    [
        ({"ab/thesis.tex": b"x"}, "ab/thesis.tex"),  # a two-character folder, a document's name
        (
            {"ab/cab1234567890abcdefghij.pdf": b"x"},
            "ab/cab1234567890abcdefghij.pdf",
        ),  # a key's name, a document's kind
        ({"my-thesis-drafts-2024/chapter1.tex": b"x"}, "my-thesis-drafts-2024/"),  # 16+ hash characters
        ({"fxgraph/notes.txt": b"x", "Photos/a.jpg": b"x"}, "Photos/"),
        ({"notes.txt": b"x"}, "notes.txt"),  # a file at the top
        ({"3UV6IQ7S2SU23V2PJU5H5I43RFGGKL2IZC5LHAAXBCKYAQVLCLIA/report.docx": b"x"}, "report.docx"),
    ],
)
def test_documents_are_not_caches(tmp_path: Path, entries: dict[str, bytes], named: str) -> None:
    root = tmp_path / "docs"
    for rel, data in entries.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / MARKER_NAME).write_text("{}")  # our marker proves nothing
    content = examine_path(root)
    assert content is not None and content.reason is not None and named in content.reason


def test_our_records_and_killed_writes_count_neither_way(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    key = "cab2lkjnzxsw626ybo7ml7dsyewjrtll5bztklkqt2rrj4lgxop3"
    (root / "ab").mkdir(parents=True)
    (root / "ab" / f"{key}.py").write_bytes(b"x")
    (root / "ab" / ".4242.139911.tmp").write_bytes(b"torch's write_atomic, killed")
    triton_key = root / "triton" / "0" / "3UV6IQ7S2SU23V2PJU5H5I43RFGGKL2IZC5LHAAXBCKYAQVLCLIA"
    triton_key.mkdir(parents=True)
    (triton_key / "k.cubin.tmp.pid_42_123456").write_bytes(b"Triton's put, killed")
    for name in (MARKER_NAME, BACKUP_OWNER_NAME, f".{MARKER_NAME}.abc.tmp"):
        (root / name).write_text("{}")
    content = examine_path(root)
    assert content is not None and content.reason is None and content.files == 3
    empty = tmp_path / "empty"
    empty.mkdir()
    assert examine_path(empty).reason is None  # type: ignore[union-attr]
    assert examine_path(tmp_path / "absent") is None


def test_a_link_is_judged_by_its_name_and_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "thesis").mkdir(parents=True)
    (outside / "thesis" / "thesis.tex").write_bytes(b"years of work")
    root = tmp_path / "cache"
    (root / "fxgraph").mkdir(parents=True)
    (root / "fxgraph" / "ab").symlink_to(outside / "thesis")
    content = examine_path(root)
    assert content is not None and content.reason is None  # a name, not a walk into what it names
    (root / "aa").symlink_to(outside)
    assert "aa" in (examine_path(root).reason or "")  # type: ignore[union-attr]


def test_a_real_cuda_training_cache_snapshots_and_restores_whole(tmp_path: Path) -> None:
    """The cache a qwen3-8b-b16 launch left on an H200 (torch 2.11, Triton 3.6; issue 40 §2): nested 4 deep at
    most (`triton/0/<key>/<kernel>`, `fxgraph/<2>/<key>/<entry>`: far from the 32 a tree may nest), kernel
    names up to 150 characters (archive paths of 223, past the tar header's 100), a `cuda_utils` library
    alone in its key folder. Snapshot and restore give back every file."""
    from dflash_doctor.cache.restore import restore_snapshot
    from dflash_doctor.cache.snapshot import take_snapshot
    from tests.cache.helpers import CPU_BUILD, tree_digests

    root = tmp_path / "inductor"
    files = build_listing(LAYOUTS / "h200-torch2.11-qwen3-8b-b16-train.txt", root)
    before = {k: v for k, v in tree_digests(root).items() if not k.startswith("locks/")}
    assert max(k.count("/") for k in before) == 3 and max(len(k) for k in before) > 200
    snap = take_snapshot({"inductor": root}, CPU_BUILD, "h200-train", tmp_path / "h200-train.tar.zst")
    assert len(snap.manifest.files) == files - sum(1 for p in root.glob("locks/*") if p.is_file())
    restore_snapshot(snap.path, {"inductor": root}, CPU_BUILD)
    assert {k: v for k, v in tree_digests(root).items() if k != MARKER_NAME} == before
