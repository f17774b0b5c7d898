"""The RECORD audit's stat of every file (`stat_each`) with 1, 2, 4 and 8 threads, on this interpreter's
environment: decides `record_audit.STAT_THREADS` on a machine with many cores (issue 40's warm `check`).

Rounds alternate the thread counts, so a machine's drift reaches every count alike; the page cache is warm
after the first round, as it is for a warm `check`.

    .venv/bin/python bench/check/stat_threads.py [--rounds 9] [--json PATH]

Prints a table (median and best milliseconds, each count against one thread); writes JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from dflash_base.atomic import write_json_atomic
from dflash_doctor.env import record_audit
from dflash_doctor.env.environment import Environment

ROOT = Path(__file__).resolve().parents[2]
COUNTS = (1, 2, 4, 8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "stat_threads.json")
    args = parser.parse_args()
    env = Environment.load()
    paths = [row[0] for dist in env.distributions.values() for row in record_audit.audited_record_rows(dist)]
    record_audit.PARALLEL_STAT_MIN = 1  # every count below really runs with that many threads
    seconds: dict[int, list[float]] = {count: [] for count in COUNTS}
    for _ in range(args.rounds):
        for count in COUNTS:
            record_audit.STAT_THREADS = count
            began = time.perf_counter()
            record_audit.stat_each(paths)
            seconds[count].append(time.perf_counter() - began)
    base = statistics.median(seconds[1])
    rows = {
        str(count): {
            "median_ms": round(1e3 * statistics.median(runs), 2),
            "best_ms": round(1e3 * min(runs), 2),
            "vs_one_thread": round(statistics.median(runs) / base, 3),
        }
        for count, runs in seconds.items()
    }
    print(f"{len(paths)} paths, {os.cpu_count()} cores, {args.rounds} rounds")
    print(f"{'threads':<9}{'median ms':>11}{'best ms':>9}{'vs 1':>7}")
    for label, row in rows.items():
        print(f"{label:<9}{row['median_ms']:>11.1f}{row['best_ms']:>9.1f}{row['vs_one_thread']:>7.2f}")
    document = {"paths": len(paths), "cores": os.cpu_count(), "rounds": args.rounds, "threads": rows}
    write_json_atomic(args.json, document)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
