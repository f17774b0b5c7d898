"""What forking its helpers costs a warm `check`'s own process: the same run with the helpers forked (as shipped)
and with forking refused (`forked.can_fork` patched to False: every slice runs in the process), alternating
rounds, each in a fresh interpreter; the machine's price of one copy-on-write page fault; and what a spawned
helper (`python -E -s -S`, no fork) would pay before its first stat.

After a fork every page of the parent is shared with the child until one of them writes it; a Python process
writes nearly every page it reads (reference counts), so the parent takes a minor fault per page it touches
while a child lives: on this 2-core box ~11.5k more faults (13.3k -> 24.8k), ~12 ms of system time. Spawned
helpers would take none, but each pays an interpreter start and the import of its module (~27 ms here) and the
parent pays to marshal ~50k paths to them (~10 ms): measured here as the same CPU in the parent as forking, and
slower on 2 cores (S21's prototype). This table says whether a machine's faults change that.

    .venv/bin/python -m bench.check.fork_cost [--python X] [--rounds 8] [--json PATH]

Prints a table (medians: wall, time inside `check`, own CPU, minor faults, the slowest checks and starters);
writes JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dflash_base.atomic import write_json_atomic

ROOT = Path(__file__).resolve().parents[2]
ARMS = ("forked", "no_fork")


def one_run(arm: str, python: str | None) -> dict[str, Any]:
    """`check --json` in this process (as `cli.main` runs it: no cyclic collector), with its rusage."""
    gc.disable()
    began = time.perf_counter()
    if arm == "no_fork":
        from dflash_doctor.env import forked

        forked.can_fork = lambda: False  # type: ignore[assignment]
    import contextlib
    import io

    from dflash_doctor.cli import run

    out = io.StringIO()
    args = ["check", "--no-lock", "--json", *(["--python", python] if python else [])]
    with contextlib.redirect_stdout(out):
        run(args)
    wall = time.perf_counter() - began
    usage = resource.getrusage(resource.RUSAGE_SELF)
    report = json.loads(out.getvalue())
    return {
        "wall_s": wall,
        "inside_s": float(report["context"]["seconds"]),
        "utime_s": usage.ru_utime,
        "stime_s": usage.ru_stime,
        "minflt": usage.ru_minflt,
        "checks": {
            **{c["id"]: float(c["seconds"]) for c in report["checks"]},
            **{f"start:{k}": float(v) for k, v in report["context"].get("start_seconds", {}).items()},
            **{f"phase:{k}": float(v) for k, v in report["context"].get("phase_seconds", {}).items()},
        },
        "findings": sorted((f["id"], f["severity"]) for f in report["findings"]),
    }


def cow_fault_cost(count: int = 49_152) -> dict[str, float]:
    """Microseconds a page fault costs here: touch (write the reference counts of) `count` RECORD-like rows
    (~12 MB of small objects), alone and while a forked child holds the pages."""
    gc.disable()
    rows = [(f"site-packages/pkg/{i}/file.py", f"sha256={i:064x}", i) for i in range(count)]

    def touch() -> tuple[float, int]:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        began = time.perf_counter()
        total = 0
        for row in rows:
            total += len(row[0])
        return time.perf_counter() - began, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    touch()
    alone, alone_faults = touch()
    pid = os.fork()
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    try:
        time.sleep(0.05)
        shared, shared_faults = touch()
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    extra = max(1, shared_faults - alone_faults)
    return {
        "objects": len(rows),
        "touch_alone_ms": alone * 1e3,
        "touch_after_fork_ms": shared * 1e3,
        "extra_faults": extra,
        "us_per_fault": (shared - alone) * 1e6 / extra,
    }


def helper_startup_ms(rounds: int = 7) -> dict[str, float]:
    """Wall milliseconds of a bare `python -E -s -S` and of one that imports the survey's module: what a
    spawned helper costs before its first stat (on CPUs the parent does not need). `-E -s -S` is `-I -S` but
    for the working directory on the path: the root's, from which `-c` imports this checkout's doctor."""
    bare, survey = [], []
    code = "import dflash_doctor.env.size_survey"
    for _ in range(rounds):
        for out, argv in ((bare, ["-c", "pass"]), (survey, ["-c", code])):
            began = time.perf_counter()
            subprocess.run([sys.executable, "-E", "-s", "-S", *argv], cwd=ROOT, check=True)
            out.append((time.perf_counter() - began) * 1e3)
    return {"bare_ms": statistics.median(bare), "survey_module_ms": statistics.median(survey)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", help="audit this interpreter's environment (default: the running one)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--cow", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one, args.python)))
        return
    if args.cow:
        print(json.dumps(cow_fault_cost()))
        return
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory(prefix="fork-cost-") as home:
        environ = {
            **os.environ,
            "DFLASH_DOCTOR_HOME": home,
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
            ),
        }
        base = [
            sys.executable,
            "-m",
            "bench.check.fork_cost",
            *(["--python", args.python] if args.python else []),
        ]
        subprocess.run(
            [*base, "--one", ARMS[0]], env=environ, capture_output=True, check=True
        )  # fills the home
        for round_ in range(args.rounds):
            for arm in ARMS[round_ % len(ARMS) :] + ARMS[: round_ % len(ARMS)]:
                done = subprocess.run(
                    [*base, "--one", arm], env=environ, capture_output=True, text=True, check=True
                )
                runs[arm].append(json.loads(done.stdout))
        cow = json.loads(
            subprocess.run([*base, "--cow"], env=environ, capture_output=True, text=True, check=True).stdout
        )
    startup = helper_startup_ms()
    rows: dict[str, dict[str, Any]] = {}
    print(
        f"{'arm':10s} {'wall s':>7s} {'inside s':>8s} {'utime s':>8s} {'stime s':>8s} {'minflt':>7s}  slowest checks"
    )
    for arm, found in runs.items():
        med = {
            k: statistics.median(r[k] for r in found)
            for k in ("wall_s", "inside_s", "utime_s", "stime_s", "minflt")
        }
        ids = found[0]["checks"]
        slowest = sorted(((statistics.median(r["checks"][i] for r in found), i) for i in ids), reverse=True)[
            :6
        ]
        med["slowest"] = {i: s for s, i in slowest}
        med["same_findings"] = all(r["findings"] == found[0]["findings"] for r in found)
        rows[arm] = med
        print(
            f"{arm:10s} {med['wall_s']:7.3f} {med['inside_s']:8.3f} {med['utime_s']:8.3f} {med['stime_s']:8.3f} "
            f"{med['minflt']:7.0f}  " + ", ".join(f"{i} {s * 1e3:.0f} ms" for s, i in slowest)
        )
    print(
        f"copy-on-write: {cow['extra_faults']} extra faults, {cow['us_per_fault']:.2f} us each "
        f"(touch {cow['touch_alone_ms']:.1f} ms alone, {cow['touch_after_fork_ms']:.1f} ms beside a child)"
    )
    print(
        f"a spawned helper's start: python -E -s -S {startup['bare_ms']:.1f} ms, with the survey's module "
        f"{startup['survey_module_ms']:.1f} ms"
    )
    if args.json:
        write_json_atomic(
            args.json,
            {"arms": rows, "runs": runs, "cow": cow, "helper_startup": startup, "rounds": args.rounds},
        )
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
