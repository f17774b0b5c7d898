"""Static `dflash-doctor check --python X` against `X -m torch.utils.collect_env`, same run.

Both are timed as fresh processes (what a person waits for), best of N after one warm-up, for each
interpreter given (default: the CPU and CUDA 13 venvs of this machine). Also times the libs check
alone (from the JSON report). Writes bench/results/check_speed.json.

    .venv/bin/python bench/check_speed.py [--repeat 3] [PYTHON ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PYTHONS = ["/work/venvs/cpu/bin/python", "/work/venvs/cu13/bin/python"]


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    return time.perf_counter() - start, done


def best_of(
    cmd: list[str], env: dict[str, str], repeat: int
) -> tuple[float, subprocess.CompletedProcess[str]]:
    timed(cmd, env)  # warm the page cache for both tools alike
    runs = [timed(cmd, env) for _ in range(repeat)]
    return min(r[0] for r in runs), runs[-1][1]


def measure(python: str, repeat: int) -> dict[str, object]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    doctor = [sys.executable, "-m", "dflash_doctor", "check", "--python", python, "--no-lock"]
    check_s, done = best_of([*doctor, "--json"], env, repeat)
    report = json.loads(done.stdout)
    libs_s = sum(c["seconds"] for c in report["checks"] if c["id"].startswith("libs"))
    collect_s, collected = best_of([python, "-m", "torch.utils.collect_env"], env, repeat)
    return {
        "python": python,
        "check_seconds": round(check_s, 3),
        "check_exit_code": done.returncode,
        "check_inner_seconds": report["context"]["seconds"],
        "libs_check_seconds": round(libs_s, 3),
        "collect_env_seconds": round(collect_s, 3),
        "collect_env_exit_code": collected.returncode,
        "speedup": round(collect_s / check_s, 1),
        "per_check_seconds": {c["id"]: c["seconds"] for c in report["checks"]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pythons", nargs="*", default=DEFAULT_PYTHONS)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = [measure(p, args.repeat) for p in args.pythons if os.path.exists(p)]
    table = Table(title=f"static check vs collect_env (best of {args.repeat}, fresh processes)")
    for col in ("python", "check (s)", "libs check (s)", "collect_env (s)", "speed-up", "check exit"):
        table.add_column(col)
    for row in rows:
        table.add_row(
            str(row["python"]),
            f"{row['check_seconds']:.2f}",
            f"{row['libs_check_seconds']:.3f}",
            f"{row['collect_env_seconds']:.2f}",
            f"{row['speedup']}x",
            str(row["check_exit_code"]),
        )
    Console().print(table)
    out = ROOT / "bench" / "results" / "check_speed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(
        json.dumps({"benchmark": "check_speed", "repeat": args.repeat, "results": rows}, indent=2) + "\n"
    )
    os.replace(tmp, out)
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
