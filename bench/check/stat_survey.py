"""The RECORD audit's survey (`size_survey.survey`: stat every file, compare sizes) in 1, 2, 4 and 8 processes,
on an interpreter's environment: decides `size_survey.MAX_PROCESSES` (issue 40's warm `check`).

Rounds alternate the process counts, so a machine's drift reaches every count alike; the page cache is warm
after the first round, as it is for a warm `check`. `--threads` adds the old threaded stat (one `os.stat` loop
a thread), which an H200 host measured slower than one loop (S19: 166 ms, 2 threads 243, 4 414, 8 409).

    .venv/bin/python -m bench.check.stat_survey [--python X] [--rounds 9] [--threads] [--json PATH]

Prints a table (median and best milliseconds, each count against one process); writes JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dflash_base.atomic import write_json_atomic
from dflash_doctor.env import forked, record_audit, size_survey
from dflash_doctor.env.environment import Environment

ROOT = Path(__file__).resolve().parents[2]
COUNTS = (1, 2, 4, 8)


def threaded_stat(paths: list[str], threads: int) -> None:
    """What `record_audit.stat_each` did before S19: contiguous slices, one `os.stat` loop a thread."""

    def stat_slice(part: list[str]) -> list[os.stat_result | None]:
        out: list[os.stat_result | None] = []
        for path in part:
            try:
                out.append(os.stat(path))
            except OSError:
                out.append(None)
        return out

    size = -(-len(paths) // threads)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(stat_slice, [paths[i : i + size] for i in range(0, len(paths), size)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", help="audit this interpreter's environment (default: this one)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", action="store_true", help="also time the threaded stat of before S19")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "stat_survey.json")
    args = parser.parse_args()
    env = Environment.load(args.python)
    record_rows = record_audit.RecordRows.of(env.distributions)
    paths = [row[0] for dist in env.distributions.values() for row in record_audit.audited_record_rows(dist)]
    size_survey.PATHS_PER_PROCESS = 1  # every count below really runs with that many processes
    arms = {f"{count} process{'es' if count > 1 else ''}": count for count in COUNTS}
    if args.threads:
        arms.update({f"{count} threads": -count for count in COUNTS[1:]})
    seconds: dict[str, list[float]] = {label: [] for label in arms}
    for _ in range(args.rounds):
        for label, count in arms.items():
            began = time.perf_counter()
            if count > 0:
                size_survey.survey(record_rows.rows, record_rows.records, processes=count)
            else:
                threaded_stat(paths, -count)
            seconds[label].append(time.perf_counter() - began)
    base = statistics.median(seconds["1 process"])
    table = {
        label: {
            "median_ms": round(1e3 * statistics.median(runs), 2),
            "best_ms": round(1e3 * min(runs), 2),
            "vs_one_process": round(statistics.median(runs) / base, 3),
        }
        for label, runs in seconds.items()
    }
    cpus = forked.usable_cpus()
    print(f"{len(paths)} paths, {cpus} usable CPUs, {args.rounds} rounds")
    print(f"{'arm':<13}{'median ms':>11}{'best ms':>9}{'vs 1':>7}")
    for label, row in table.items():
        print(f"{label:<13}{row['median_ms']:>11.1f}{row['best_ms']:>9.1f}{row['vs_one_process']:>7.2f}")
    document = {"paths": len(paths), "usable_cpus": cpus, "rounds": args.rounds, "arms": table}
    write_json_atomic(args.json, document)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
