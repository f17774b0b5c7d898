"""Warm-start proof: a compiled flex_attention's first call in a fresh process, cold, warm (same
folder), and after `restore` of a snapshot into an empty folder. Restored should be within 20% of warm,
and the Inductor counters should show cache hits.

Each run is a new process of `dflash_doctor/cache/warm_child.py` (DFlash block mask, compiled
create_block_mask + flex_attention; forward, + backward on CUDA). CPU default shapes are small; the
story's H200 shapes:

    .venv/bin/python -m bench.cache.warm_start --device cuda --heads 32 --head-dim 128 --kv-heads 8 \\
        --anchors 1024 --block 32 --context 40000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dflash_doctor.cache.fingerprint import fingerprint_of, read_gpu_names
from dflash_doctor.cache.restore import restore_snapshot
from dflash_doctor.cache.snapshot import take_snapshot
from dflash_doctor.cache.warm import WarmShapes, child_command, compile_count, run_warm_child
from dflash_doctor.env.environment import Environment


def fresh_process(command: list[str], cache: Path) -> tuple[dict, float]:
    environ = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    environ.pop("TRITON_CACHE_DIR", None)  # Triton kernels go to <cache>/triton, inside the snapshot
    start = time.perf_counter()
    result = run_warm_child(command, environ)
    return result, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--heads", type=int, default=WarmShapes.heads)
    parser.add_argument("--head-dim", type=int, default=WarmShapes.head_dim)
    parser.add_argument("--kv-heads", type=int, default=WarmShapes.kv_heads)
    parser.add_argument("--anchors", type=int, default=WarmShapes.anchors)
    parser.add_argument("--block", type=int, default=WarmShapes.block)
    parser.add_argument("--context", type=int, default=WarmShapes.context)
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose torch is measured")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parents[1] / "results" / "warm_start.json"
    )
    args = parser.parse_args()
    shapes = WarmShapes(args.heads, args.head_dim, args.kv_heads, args.anchors, args.block, args.context)
    shapes.validate()
    command = child_command(args.python, args.device, shapes)
    env = Environment.load(None if args.python == sys.executable else args.python)
    build = fingerprint_of(env, read_gpu_names())
    work = Path(tempfile.mkdtemp(prefix="dflash-warm-", dir=args.workdir))
    console = Console()
    rows = {}
    try:
        first = work / "first"
        rows["cold"] = fresh_process(command, first)
        rows["warm"] = fresh_process(command, first)
        snap = take_snapshot({"inductor": first}, build, "warm-start", work / "warm-start.tar.zst")
        restored = work / "restored" / "inductor"
        restore_start = time.perf_counter()
        restore_snapshot(snap.path, {"inductor": restored}, build)
        restore_seconds = time.perf_counter() - restore_start
        rows["restored"] = fresh_process(command, restored)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    table = Table(title=f"flex_attention first call in a fresh process · {args.device} · {build.describe()}")
    for column in ("cache", "first call", "process", "fxgraph compiled", "fxgraph hits", "autograd hits"):
        table.add_column(column)
    summary = {}
    for label, (result, wall) in rows.items():
        misses, hits = compile_count(result)
        autograd_hits = result.get("counters", {}).get("aot_autograd", {}).get("autograd_cache_hit", 0)
        summary[label] = {
            "first_call_s": result["first_call_seconds"],
            "second_call_s": result.get("second_call_seconds"),
            "process_s": round(wall, 3),
            "fxgraph_cache_miss": misses,
            "fxgraph_cache_hit": hits,
            "autograd_cache_hit": autograd_hits,
        }
        table.add_row(
            label,
            f"{result['first_call_seconds']:.2f} s",
            f"{wall:.2f} s",
            str(misses),
            str(hits),
            str(autograd_hits),
        )
    console.print(table)
    warm, restored_s = summary["warm"]["first_call_s"], summary["restored"]["first_call_s"]
    ratio = restored_s / warm if warm else float("inf")
    verdict = (
        ratio <= 1.2
        and summary["restored"]["fxgraph_cache_hit"] > 0
        and summary["restored"]["fxgraph_cache_miss"] == 0
    )
    console.print(
        f"restored / warm = {ratio:.2f} (goal <= 1.20), cold / restored = {summary['cold']['first_call_s'] / restored_s:.1f}x, "
        f"restore took {restore_seconds:.2f} s for {len(snap.manifest.files)} files: {'PASS' if verdict else 'FAIL'}"
    )
    data = {
        "bench": "warm_start",
        "device": args.device,
        "build": build.to_json(),
        "shapes": rows["cold"][0].get("shapes"),
        "backward": rows["cold"][0].get("backward"),
        "runs": summary,
        "restore_seconds": round(restore_seconds, 3),
        "snapshot_files": len(snap.manifest.files),
        "snapshot_mb": round(snap.manifest.total_bytes / 1e6, 2),
        "restored_over_warm": round(ratio, 3),
        "pass": verdict,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    console.print(f"wrote {args.out}")
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
