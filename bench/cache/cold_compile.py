"""Where a cold warm-up's seconds go: the launcher's own warm-up child, run as `train` runs it.

Each row runs `dflash_doctor/cache/warm_child.py --config <recipe>` (what `train` runs before torchrun when the
compile cache is cold) in a fresh process with empty Inductor and Triton caches and its own TMPDIR, and records:

  wall_s            the child's wall time, process start to exit
  phases            the child's own report: target build, target capture (its compile), drafter first step
  compile_times     Dynamo's per-phase compile timers (`torch._dynamo.utils.compilation_time_metrics`)
  busy_cores        the machine's busy CPU cores, averaged over 10 s windows (from /proc/stat): a compile that
                    waits on one thread shows ~1; Inductor's compile workers show many
  stacks            the child's Python stacks every --stack-every seconds (faulthandler), in --stacks-dir

Rows run in the order given, so the first row on a fresh machine also pays what a machine pays once.
`--env NAME=VALUE` (repeatable, per row after it: `--row`) changes one row's environment, e.g. a bytecode cache.

    python3 -m bench.cache.cold_compile --row qwen3-8b-b16 --row qwen3-8b-b16 --row seed-b32 --out $OUT/cold.json
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.lib.roles import write_result

ROOT = Path(__file__).resolve().parents[2]

RESULT_PREFIX = "COLD_COMPILE_CHILD "


def busy_sampler(samples: list[tuple[float, float]], stop: threading.Event, every: float = 1.0) -> None:
    """(time, busy cores) once a second from /proc/stat's aggregate line."""

    def read() -> tuple[float, float]:
        fields = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + fields[4]
        return sum(fields), idle

    last_total, last_idle = read()
    cores = os.cpu_count() or 1
    while not stop.wait(every):
        total, idle = read()
        span = total - last_total
        if span > 0:
            samples.append((time.monotonic(), cores * (1 - (idle - last_idle) / span)))
        last_total, last_idle = total, idle


def windows(samples: list[tuple[float, float]], start: float, width: float = 10.0) -> list[float]:
    """Mean busy cores per `width`-second window since `start`."""
    out: dict[int, list[float]] = {}
    for t, busy in samples:
        out.setdefault(int((t - start) // width), []).append(busy)
    return [round(sum(v) / len(v), 1) for _, v in sorted(out.items())]


def run_row(recipe: str, extra_env: dict[str, str], index: int, args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"cold-compile-{index}-"))
    env = dict(os.environ)
    for name in ("inductor", "triton", "tmp"):
        (work / name).mkdir()
    env.update(
        TORCHINDUCTOR_CACHE_DIR=str(work / "inductor"),
        TRITON_CACHE_DIR=str(work / "triton"),
        TMPDIR=str(work / "tmp"),
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
    )
    env.update(extra_env)
    config = ROOT / "configs" / f"{recipe}.toml"
    stacks = Path(args.stacks_dir) / f"row{index}-{recipe}.txt"
    stacks.parent.mkdir(parents=True, exist_ok=True)
    child = [
        sys.executable,
        "-m",
        "bench.cache.cold_compile",
        "--child",
        str(stacks),
        "--stack-every",
        str(args.stack_every),
        "--",
        "--device",
        args.device,
        "--config",
        str(config),
        "--project-root",
        str(ROOT),
    ]
    samples: list[tuple[float, float]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=busy_sampler, args=(samples, stop), daemon=True)
    start = time.monotonic()
    sampler.start()
    try:
        done = subprocess.run(
            child, env=env, capture_output=True, text=True, timeout=args.row_timeout, check=False
        )
        rc, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        rc, stdout, stderr = 124, str(exc.stdout or ""), str(exc.stderr or "")
    wall = time.monotonic() - start
    stop.set()
    sampler.join()
    report: dict[str, Any] = {}
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            report = json.loads(line[len(RESULT_PREFIX) :])
    (stacks.parent / f"row{index}-{recipe}.stderr.txt").write_text(stderr[-200_000:])
    return {
        "row": index,
        "recipe": recipe,
        "env": extra_env,
        "exit": rc,
        "wall_s": round(wall, 1),
        "busy_cores": windows(samples, start),
        **report,
    }


def child_main(stack_file: str, every: float, warm_argv: list[str]) -> int:
    """Inside the row's process: stacks every `every` s, the warm-up child's main, then the timers."""
    began = time.monotonic()
    with open(stack_file, "w") as stacks:
        faulthandler.dump_traceback_later(every, repeat=True, file=stacks)
        import io
        from contextlib import redirect_stdout

        from dflash_doctor.cache import warm_child

        captured = io.StringIO()
        with redirect_stdout(captured):
            warm_child.main(warm_argv)
        faulthandler.cancel_dump_traceback_later()
    from torch._dynamo.utils import compilation_time_metrics, counters

    warm = {}
    for line in captured.getvalue().splitlines():
        if line.startswith(warm_child.RESULT_PREFIX):
            warm = json.loads(line[len(warm_child.RESULT_PREFIX) :])
    timers = {
        name: {"total_s": round(sum(values), 2), "calls": len(values)}
        for name, values in compilation_time_metrics.items()
        if sum(values) >= 0.5
    }
    report = {
        "child_s": round(time.monotonic() - began, 1),
        "phases": warm.get("stats"),
        "compile_times": dict(sorted(timers.items(), key=lambda kv: -kv[1]["total_s"])),
        "counters": {group: dict(values) for group, values in counters.items()},
    }
    print(RESULT_PREFIX + json.dumps(report), flush=True)
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        split = sys.argv.index("--")
        return child_main(sys.argv[2], float(sys.argv[4]), sys.argv[split + 1 :])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--row", action="append", required=True, help="a recipe in configs/ (repeatable)")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the row named before it")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--stack-every", type=float, default=10.0)
    parser.add_argument("--stacks-dir", default="/tmp/cold-compile-stacks")
    parser.add_argument("--row-timeout", type=float, default=400.0)
    parser.add_argument(
        "--budget-s", type=float, default=560.0, help="skip rows that cannot start before this"
    )
    parser.add_argument("--out", default=None)
    # --env applies to the --row given just before it: re-parse the order by hand.
    rows: list[tuple[str, dict[str, str]]] = []
    argv = sys.argv[1:]
    for i, token in enumerate(argv):
        if token == "--row":
            rows.append((argv[i + 1], {}))
        elif token == "--env":
            name, _, value = argv[i + 1].partition("=")
            rows[-1][1][name] = value
    args = parser.parse_args()
    began = time.monotonic()
    results = []
    for index, (recipe, extra) in enumerate(rows, 1):
        if time.monotonic() - began > args.budget_s:
            results.append({"row": index, "recipe": recipe, "env": extra, "skipped": "budget"})
            continue
        row = run_row(recipe, extra, index, args)
        results.append(row)
        if args.out:  # after every row: a stage cut short by its time limit keeps the rows it finished
            write_result(Path(args.out), {"bench": "cold_compile", "rows": results})
        print(
            json.dumps(
                {k: row.get(k) for k in ("row", "recipe", "env", "exit", "wall_s", "child_s", "phases")}
            )
        )
        print("  busy cores per 10 s:", row["busy_cores"])
        print("  compile times:", json.dumps(row.get("compile_times", {}))[:1500], flush=True)
    if args.out:
        write_result(Path(args.out), {"bench": "cold_compile", "rows": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
