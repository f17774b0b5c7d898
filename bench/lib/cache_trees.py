"""Synthetic compile-cache trees the cache benchmarks and the cache tests both make: an Inductor-like tree
of random files and its digests, a manifest for given members, a restore forked with its progress reported
through a pipe (for kill loops). The tests take them through tests/cache/helpers.py."""

from __future__ import annotations

import base64
import hashlib
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

from dflash_doctor.cache.fingerprint import BuildFingerprint
from dflash_doctor.cache.manifest import CacheManifest, FileEntry

CPU_BUILD = BuildFingerprint(
    torch_version="2.13.0+cpu",
    torch_git="cf30153c4c131c8164ee7798e5022d810682e2cb",
    cuda=None,
    triton_version=None,
    python="3.11",
    gpu_names=None,
)


def inductor_key(*parts: object) -> str:
    """A 52-character lowercase base32 key, as Inductor names its entries (deterministic from `parts`)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return base64.b32encode(digest).decode().lower().rstrip("=")


def make_tree(root: Path, files: int = 40, seed: int = 0, size: int = 2000) -> dict[str, str]:
    """A cache-like tree laid out as Inductor lays it out (`<2 chars>/c<key>.py|.so|.cpp`, where the two
    characters are the key's first two; `fxgraph/<2 chars>/f<key>/<entry key>`); returns relative path ->
    sha256."""
    rng = random.Random(seed)
    digests = {}
    for index in range(files):
        kind = rng.choice(["py", "so", "cpp"])
        key = inductor_key(seed, index)
        rel = f"{key[:2]}/c{key}.{kind}"
        if index % 5 == 0:
            rel = f"fxgraph/{key[:2]}/f{key}/{inductor_key(seed, index, 'entry')}"
        data = rng.randbytes(rng.randint(1, size)) + f"seed {seed} file {index}\n".encode() * 20
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        digests[rel] = hashlib.sha256(data).hexdigest()
    return digests


def tree_digests(
    root: Path, skip: tuple[str, ...] = (".dflash-doctor.json", ".dflash-doctor-backup.json")
) -> dict[str, str]:
    """Relative path -> sha256 of every file under root, our own records (marker, backup owner) left out."""
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            if rel not in skip:
                found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def manifest_for(members: dict[str, bytes], fingerprint: BuildFingerprint = CPU_BUILD) -> CacheManifest:
    files = [FileEntry(p, len(d), hashlib.sha256(d).hexdigest(), 0o644, 1.0) for p, d in members.items()]
    return CacheManifest("hostile", 1.0, fingerprint, {"inductor": "/origin"}, files)


def fork_reporting(work: Callable[[], object]) -> tuple[int, int]:
    """Fork a process that runs `work` and exits (0, or 1 on any error), its restore `_pause` hook
    writing one byte per call to a pipe; return (pid, read end of that pipe). For kill loops."""
    from dflash_doctor.cache import restore

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_end)

        def report_progress() -> None:
            os.write(write_end, b".")
            time.sleep(0.0005)

        restore._pause = report_progress
        code = 0
        try:
            work()
        except BaseException:
            code = 1
        os._exit(code)
    os.close(write_end)
    return pid, read_end


def wait_for_progress(read_end: int, points: int) -> None:
    """Read `points` bytes of progress, or until the child is gone."""
    seen = 0
    while seen < points:
        chunk = os.read(read_end, points - seen)
        if not chunk:  # the child finished first
            return
        seen += len(chunk)
