"""What listing a v1 archive (one zstd stream, no seek table) costs now that `cache list` checks it
is whole (issue 21's closing note: a truncated v1 copy was listed as restorable).

Builds a v1 snapshot the way v1 was written (tar into a multi-threaded zstd stream_writer: one frame,
no declared size) of `--mb` MB of cache-like files, then times: the frame walk alone
(frames.walk_frames), `read_manifest` (what `cache list` does per archive), the store's listing of
the archive and of a copy cut in half, against decompressing the whole stream (what only a restore
does). Prints a table and writes JSON.

    .venv/bin/python -m bench.cache.cache_list_v1 [--mb 256] [--repeat 5]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
import statistics
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import zstandard
from rich.console import Console
from rich.table import Table

from bench.lib.cache_trees import manifest_for
from dflash_doctor.cache.extract import read_manifest
from dflash_doctor.cache.frames import walk_frames
from dflash_doctor.cache.store import SnapshotStore

RESULTS = Path(__file__).resolve().parents[1] / "results" / "cache_list_v1.json"
FILE_BYTES = 1 << 20
POOL_BYTES = 16 << 20


def build_v1(dest: Path, megabytes: int) -> int:
    """A v1 archive of `megabytes` 1 MiB files of source-like text (compresses ~3x, as generated
    kernels do), each a slice of a 16 MiB pool at a random offset (zstd's 2 MiB window sees no repeat)."""
    rng = random.Random(21)
    words = [
        bytes(rng.choices(b"abcdefghijklmnopqrstuvwxyz_(),:=", k=rng.randint(2, 12))) for _ in range(5000)
    ]
    pool = b" ".join(rng.choices(words, k=3_000_000))[: POOL_BYTES + FILE_BYTES]
    members = {}
    for i in range(megabytes):
        start = rng.randrange(POOL_BYTES)
        members[f"inductor/{i % 97:02x}/c{i}.py"] = pool[start : start + FILE_BYTES]
    manifest = manifest_for(members)
    manifest.schema = "dflash-doctor/cache-manifest/v1"
    with (
        open(dest, "wb") as raw,
        zstandard.ZstdCompressor(threads=-1).stream_writer(raw) as out,
        tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name, data in [("MANIFEST.json", manifest.to_bytes()), *members.items()]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return sum(len(d) for d in members.values())


def best_of(repeat: int, work: Callable[[], object]) -> tuple[float, float]:
    """(best, median) seconds of `repeat` runs (the file is in the page cache after the first)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def decompress_all(path: Path) -> None:
    with open(path, "rb") as raw:
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        while reader.read(4 << 20):
            pass


def walk(path: Path) -> None:
    with open(path, "rb") as raw:
        walk_frames(raw, str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="MB of files in the archive")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dflash-list-v1-") as folder:
        store = SnapshotStore(Path(folder) / "store")
        store.ensure()
        archive = store.path_for("v1")
        tar_bytes = build_v1(archive, args.mb)
        size = archive.stat().st_size
        rows = {
            "frame walk (walk_frames)": best_of(args.repeat, lambda: walk(archive)),
            "read_manifest (per archive in cache list)": best_of(args.repeat, lambda: read_manifest(archive)),
            "store listing, intact": best_of(args.repeat, store.snapshots),
            "full decompress (restore's share)": best_of(
                min(args.repeat, 3), lambda: decompress_all(archive)
            ),
        }
        store.path_for("cut").write_bytes(archive.read_bytes()[: size // 2])
        rows["store listing, intact + cut copy"] = best_of(args.repeat, store.snapshots)
        listed = {s.name: s for s in store.snapshots()}
        assert listed["cut"].damaged and not listed["v1"].damaged
    table = Table(
        title=f"listing a v1 archive: {tar_bytes / 1e6:.0f} MB of files, {size / 1e6:.0f} MB archive"
    )
    for column in ("operation", "best s", "median s"):
        table.add_column(column)
    for name, (best, median) in rows.items():
        table.add_row(name, f"{best:.4f}", f"{median:.4f}")
    Console().print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "archive_bytes": size,
                "file_bytes": tar_bytes,
                "repeat": args.repeat,
                "seconds": {name: {"best": b, "median": m} for name, (b, m) in rows.items()},
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
