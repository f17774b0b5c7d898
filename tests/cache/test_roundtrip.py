"""Round trip with a real Inductor cache: compile in a subprocess, snapshot, wipe, restore, and every
file's sha256 is identical."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from dflash_doctor.cache.archive import read_manifest
from dflash_doctor.cache.restore import restore_snapshot
from dflash_doctor.cache.snapshot import take_snapshot
from tests.cache.helpers import CPU_BUILD, tree_digests

COMPILE_SMALL = """
import torch
f = torch.compile(lambda x: (x.sin() * 2 + 1).sum())
print(float(f(torch.arange(8, dtype=torch.float32))))
from torch._dynamo.utils import counters
print(dict(counters["inductor"]))
"""


def test_real_inductor_cache_round_trip(tmp_path: Path) -> None:
    cache = tmp_path / "inductor"
    environ = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    environ.pop("TRITON_CACHE_DIR", None)
    done = subprocess.run(
        [sys.executable, "-c", COMPILE_SMALL], env=environ, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "fxgraph_cache_miss" in done.stdout
    assert list(cache.glob("fxgraph/*/*/*")), "Inductor wrote no FX graph cache entry"

    before = {k: v for k, v in tree_digests(cache).items() if not k.startswith("locks/")}
    assert any(k.endswith(".so") for k in before) and any(k.endswith(".py") for k in before)
    snap = take_snapshot({"inductor": cache}, CPU_BUILD, "real", tmp_path / "real.tar.zst")
    assert {f.path.removeprefix("inductor/") for f in read_manifest(snap.path).files} == set(before)

    shutil.rmtree(cache)
    restore_snapshot(snap.path, {"inductor": cache}, CPU_BUILD)
    assert tree_digests(cache) == before
    assert (cache / ".dflash-doctor.json").is_file()
