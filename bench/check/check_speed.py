"""`dflash-doctor check` (the static audit) timed as a person waits for it: fresh processes, first and warm
(issue 40 §2: goals <= 2 s first, <= 0.5 s warm on the H200 machine).

Each round makes a fresh DFLASH_DOCTOR_HOME (no parse cache: every dist-info, RECORD and ELF file parsed),
runs `check` once (first), then `--warm` more times in that home (warm: parses from the cache), then `--plain` more
times as the README runs it, without `--json` (the findings drawn by rich, which `--json` never imports). Our bytecode is
compiled before the first round, as `pip install` does. `--repo` runs another checkout (its packages first on
PYTHONPATH, this interpreter) for a before/after on one machine; the findings of every run must be the same
(ids and severities), else the script says so and exits 1.

    .venv/bin/python -m bench.check.check_speed [--rounds 3] [--warm 3] [--repo PATH] [--python X]

Prints a table; writes JSON (default bench/results/check_speed_40.json).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dflash_base.atomic import write_json_atomic

ROOT = Path(__file__).resolve().parents[2]


# Findings whose evidence says how much work a check had: the cache folders walked, the RECORD files stat'ed.
SIZE_EVIDENCE = {
    "cache.location": ("path", "files"),
    "cache.volatile": ("path", "files"),
    "ownership.clobbered": ("files_checked",),
}


def run_check(repo: Path, home: Path, python: str | None, json_out: bool) -> tuple[float, str, str, int]:
    """One `check` in a fresh process: wall seconds, its stdout, its stderr, its exit code."""
    command = [os.path.abspath(sys.executable), "-m", "dflash_doctor", "check", "--no-lock"]
    command += ["--json"] if json_out else []
    command += ["--python", python] if python else []
    environ = {k: v for k, v in os.environ.items() if k != "DFLASH_DOCTOR_CACHE_DIR"}
    # the repo first (a before/after of two checkouts), then what the caller had (a device's carried wheels)
    inherited = [entry for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    environ.update(DFLASH_DOCTOR_HOME=str(home), PYTHONPATH=os.pathsep.join([str(repo), *inherited]))
    began = time.perf_counter()
    done = subprocess.run(command, cwd=repo, env=environ, capture_output=True, text=True, check=False)
    return time.perf_counter() - began, done.stdout, done.stderr, done.returncode


def one_check(
    repo: Path, home: Path, python: str | None
) -> tuple[float, list[tuple[str, str]], dict[str, float], list[dict[str, Any]]]:
    """Wall seconds, the findings (id, severity), where the time inside `check` went (its own report), and
    how much work the slow checks had (SIZE_EVIDENCE)."""
    seconds, stdout, stderr, code = run_check(repo, home, python, json_out=True)
    try:
        report = json.loads(stdout)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"check printed no JSON (exit {code}): {stderr[-2000:]}") from exc
    inner = {"inside_check": float(report["context"]["seconds"])}
    if "cpu_seconds" in report["context"]:  # the process's own CPU time, start-up included (not its helpers')
        inner["own_cpu"] = float(report["context"]["cpu_seconds"])
    inner.update({c["id"]: float(c["seconds"]) for c in report.get("checks", [])})
    # what each starter cost this process before any check ran (S21 on; older code reports none)
    inner.update({f"start:{k}": float(v) for k, v in report["context"].get("start_seconds", {}).items()})
    inner.update({f"phase:{k}": float(v) for k, v in report["context"].get("phase_seconds", {}).items()})
    work = [
        {"id": f["id"], **{k: f["evidence"].get(k) for k in SIZE_EVIDENCE[f["id"]]}}
        for f in report["findings"]
        if f["id"] in SIZE_EVIDENCE and isinstance(f.get("evidence"), dict)
    ]
    return seconds, sorted((f["id"], f["severity"]) for f in report["findings"]), inner, work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm", type=int, default=3, help="warm runs after each first run")
    parser.add_argument(
        "--plain", type=int, default=3, help="warm runs without --json after those, per round"
    )
    parser.add_argument("--repo", type=Path, default=ROOT)
    parser.add_argument("--python", default=None, help="audit this interpreter (default: the running one)")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "check_speed_40.json")
    args = parser.parse_args()
    repo = args.repo.resolve()
    for package in ("dflash_doctor", "dflash_base", "checks", "trainer"):
        compileall.compile_dir(str(repo / package), quiet=1)
    first: list[float] = []
    warm: list[float] = []
    plain: list[float] = []
    warm_inner: list[dict[str, float]] = []
    work: list[dict[str, Any]] = []
    findings: set[tuple[tuple[str, str], ...]] = set()
    with tempfile.TemporaryDirectory(prefix="check-speed-") as scratch:
        for index in range(args.rounds):
            home = Path(scratch) / f"home-{index}"
            seconds, found, _, _ = one_check(repo, home, args.python)
            first.append(seconds)
            findings.add(tuple(found))
            for _ in range(args.warm):
                seconds, found, inner, work = one_check(repo, home, args.python)
                warm.append(seconds)
                warm_inner.append(inner)
                findings.add(tuple(found))
            for _ in range(args.plain):
                seconds, stdout, stderr, code = run_check(repo, home, args.python, json_out=False)
                if code not in (0, 1) or "dflash-doctor check" not in stdout:
                    raise SystemExit(f"check without --json failed (exit {code}): {stderr[-2000:]}")
                plain.append(seconds)
    rows: dict[str, Any] = {
        "first": {
            "best_s": round(min(first), 3),
            "median_s": round(statistics.median(first), 3),
            "runs": first,
            # on a freshly started machine the very first run reads every file from a cold disk: the run a user
            # waits for first, which the best of the fresh homes after it hides (BENCHMARKS 4.9, S19)
            "first_of_all_s": round(first[0], 3),
        },
        "warm": {"best_s": round(min(warm), 3), "median_s": round(statistics.median(warm), 3), "runs": warm},
    }
    if plain:  # what the README's `dflash-doctor check` costs: the same audit, drawn by rich
        rows["warm_plain"] = {
            "best_s": round(min(plain), 3),
            "median_s": round(statistics.median(plain), 3),
            "runs": plain,
        }
    print(f"{'check':<12}{'best s':>9}{'median s':>10}{'runs':>6}")
    for name, row in rows.items():
        print(f"{name:<12}{row['best_s']:>9.2f}{row['median_s']:>10.2f}{len(row['runs']):>6}")
    print(f"the first of all the runs: {first[0]:.2f} s (cold on a freshly started machine)")
    # The warm runs' median inside `check` and per check: start-up (interpreter, imports) is the rest.
    inside = {k: round(statistics.median(run.get(k, 0.0) for run in warm_inner), 4) for k in warm_inner[0]}
    own_cpu = inside.pop("own_cpu", None)
    slowest = dict(sorted(inside.items(), key=lambda kv: -kv[1])[:6])
    rows["warm"]["median_inside_s"] = slowest
    rows["warm"]["work"] = work
    print("warm, median seconds inside check: " + ", ".join(f"{k} {v:.3f}" for k, v in slowest.items()))
    if own_cpu is not None:  # what the wall time cannot go below, however many CPUs the helpers get
        rows["warm"]["own_cpu_median_s"] = own_cpu
        print(
            f"warm, median CPU seconds of check's own process (start-up included, helpers not): {own_cpu:.3f}"
        )
    print("work: " + "; ".join(", ".join(f"{k} {v}" for k, v in item.items()) for item in work))
    same = len(findings) == 1
    print(
        "findings: the same in every run" if same else f"findings DIFFER between runs: {len(findings)} sets"
    )
    document = {"repo": str(repo), "python": args.python or sys.executable, "same_findings": same, **rows}
    write_json_atomic(args.json, document)
    print(f"wrote {args.json}")
    raise SystemExit(0 if same else 1)


if __name__ == "__main__":
    main()
