"""What the RECORD audit costs: cold and warm hash cache against hashing every file (the naive way).

For each interpreter: sha256 of every file its RECORDs list (baseline), then the audit the
`ownership.*` checks run (stat everything, sha256 shared files and the CUDA libraries) with an
empty hash cache (cold) and again with the saved cache (warm); then `check --only packages,ownership`
and `pip check` as fresh processes. The page cache is not dropped (no root games on a shared box):
"cold" means our hash cache is empty, not that the disk is. Writes bench/results/ownership_hashing.json.

    .venv/bin/python -m bench.doctor.ownership_hashing [PYTHON ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dflash_base.atomic import write_json_atomic
from dflash_doctor.audit.packages import libraries_worth_hashing
from dflash_doctor.context import CheckContext
from dflash_doctor.env.environment import Environment
from dflash_doctor.env.file_hashes import CACHE_DIR_ENV, HashCache, sha256_of
from dflash_doctor.env.record_audit import audit_records, audited_rows

ROOT = Path(__file__).resolve().parents[2]

DEFAULT_PYTHONS = ["/work/venvs/cpu/bin/python", "/work/venvs/cu13/bin/python"]


def hash_everything(env: Environment) -> tuple[float, int, int]:
    """Baseline: sha256 of every audited RECORD file; (seconds, files, bytes)."""
    start, files, size = time.perf_counter(), 0, 0
    for dist in env.distributions.values():
        for entry in audited_rows(dist):
            try:
                sha256_of(entry.path)
            except OSError:
                continue
            files += 1
            size += entry.size or 0
    return time.perf_counter() - start, files, size


def fresh_process(cmd: list[str], env: dict[str, str]) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    return time.perf_counter() - start, done.returncode


def measure(python: str) -> dict[str, object]:
    env = Environment.load(python)
    ctx = CheckContext(env)
    hash_paths = libraries_worth_hashing(ctx)  # includes the library report, timed by check_speed.py
    naive_s, naive_files, naive_bytes = hash_everything(env)
    with tempfile.TemporaryDirectory() as scratch:
        cache_file = Path(scratch) / "file-hashes.json"
        cold_cache = HashCache.load(cache_file)
        cold = audit_records(env.distributions, cold_cache, hash_paths)
        cold_cache.save()
        warm = audit_records(env.distributions, HashCache.load(cache_file), hash_paths)
        child_env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", **{CACHE_DIR_ENV: scratch})
        doctor = [sys.executable, "-m", "dflash_doctor", "check", "--python", python, "--no-lock"]
        fresh_process([*doctor, "--only", "packages,ownership"], child_env)  # page cache, imports
        check_s, check_rc = fresh_process([*doctor, "--only", "packages,ownership"], child_env)
        pip_s, pip_rc = fresh_process([python, "-m", "pip", "check"], child_env)
    return {
        "python": python,
        "files_in_records": cold.files_checked,
        "naive_full_hash_seconds": round(naive_s, 3),
        "naive_files": naive_files,
        "naive_mib": round(naive_bytes / 2**20, 1),
        "cold_audit_seconds": round(cold.seconds, 3),
        "cold_files_hashed": cold.files_hashed,
        "cold_mib_hashed": round(cold.bytes_hashed / 2**20, 1),
        "warm_audit_seconds": round(warm.seconds, 3),
        "warm_files_hashed": warm.files_hashed,
        "warm_cache_hits": warm.cache_hits,
        "speedup_warm_vs_naive": round(naive_s / warm.seconds, 1) if warm.seconds else None,
        "check_packages_ownership_process_seconds": round(check_s, 3),
        "check_exit_code": check_rc,
        "pip_check_process_seconds": round(pip_s, 3),
        "pip_check_exit_code": pip_rc,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pythons", nargs="*", default=DEFAULT_PYTHONS)
    args = parser.parse_args()
    rows = [measure(p) for p in args.pythons if os.path.exists(p)]
    table = Table(title="RECORD audit: naive full sha256 vs stat + selective sha256 with a hash cache")
    for col in (
        "python",
        "files",
        "naive (s / MiB)",
        "cold audit (s / MiB)",
        "warm audit (s)",
        "warm vs naive",
        "check pkgs+own (s)",
        "pip check (s)",
    ):
        table.add_column(col)
    for r in rows:
        table.add_row(
            str(r["python"]),
            str(r["files_in_records"]),
            f"{r['naive_full_hash_seconds']:.2f} / {r['naive_mib']}",
            f"{r['cold_audit_seconds']:.2f} / {r['cold_mib_hashed']}",
            f"{r['warm_audit_seconds']:.3f}",
            f"{r['speedup_warm_vs_naive']}x",
            f"{r['check_packages_ownership_process_seconds']:.2f} (exit {r['check_exit_code']})",
            f"{r['pip_check_process_seconds']:.2f}",
        )
    Console().print(table)
    out = write_json_atomic(
        ROOT / "bench" / "results" / "ownership_hashing.json",
        {"benchmark": "ownership_hashing", "results": rows},
    )
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
