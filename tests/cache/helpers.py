"""Synthetic cache trees and hand-built (possibly hostile) archives for the cache tests (the trees themselves:
bench/lib/cache_trees.py, which the cache benchmarks share)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import zstandard

# The trees, digests and kill-loop forks the cache benchmarks make too: their home is bench/lib/cache_trees.py.
from bench.lib.cache_trees import CPU_BUILD as CPU_BUILD
from bench.lib.cache_trees import fork_reporting as fork_reporting
from bench.lib.cache_trees import inductor_key as inductor_key
from bench.lib.cache_trees import make_tree as make_tree
from bench.lib.cache_trees import manifest_for as manifest_for
from bench.lib.cache_trees import tree_digests as tree_digests
from bench.lib.cache_trees import wait_for_progress as wait_for_progress
from dflash_doctor.cache.fingerprint import BuildFingerprint, fingerprint_of, read_gpu_names
from dflash_doctor.cache.manifest import MANIFEST_MEMBER, CacheManifest


def live_build() -> BuildFingerprint:
    """The build the CLI compares snapshots against on this machine (torch, CUDA, Triton as installed):
    a test that drives `cache` commands makes its archives for this one, so it passes whatever
    torch or Triton the test environment holds (CPU_BUILD only matches one CPU wheel without Triton)."""
    from dflash_doctor.env.environment import Environment

    return fingerprint_of(Environment.load(None), read_gpu_names())


def write_raw_archive(
    dest: Path,
    manifest: CacheManifest | bytes | None,
    members: list[tarfile.TarInfo | tuple[str, bytes]],
    stream: bool = False,
) -> Path:
    """Write exactly these members (after the manifest, when given) into a .tar.zst: one frame that
    declares its size, or with `stream` as v1 snapshots were written (a multi-threaded stream_writer:
    one frame that does not)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if manifest is not None:
            raw = manifest if isinstance(manifest, bytes) else manifest.to_bytes()
            info = tarfile.TarInfo(MANIFEST_MEMBER)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
            else:
                name, data = member
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    if stream:
        with open(dest, "wb") as raw, zstandard.ZstdCompressor(threads=2).stream_writer(raw) as out:
            out.write(buffer.getvalue())
    else:
        dest.write_bytes(zstandard.ZstdCompressor().compress(buffer.getvalue()))
    return dest
