"""Seconds to the first step on CPU, cold then warm (issue 39 U4): two `dflash-doctor train` launches of
tiny-cpu in a fresh home, the second changing only `optim.lr` and `eval.every`. Per launch: the time from the
command's start to the first metrics line, the warm-up child's verdict, and the worker's own compile counters
(fxgraph misses: graphs the worker compiled itself).

    .venv/bin/python -m bench.e2e.first_step_cpu --workdir /tmp/first-step [--repo PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TINY = [
    "data.seq_len=64",
    "data.num_samples=32",
    "optim.batch_size=2",
    "optim.anchors=8",
    "checkpoint.every=0",
]


def launch(repo: Path, home: Path, out: Path, extra: list[str]) -> dict[str, Any]:
    sets = [*TINY, "optim.steps=3", f"output.dir={json.dumps(str(out))}", *extra]
    command = [sys.executable, "-m", "dflash_doctor", "train", "--config", "tiny-cpu", "--no-deep"]
    command += [arg for item in sets for arg in ("--set", item)]
    environ = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    environ.update(DFLASH_DOCTOR_HOME=str(home), COLUMNS="250")
    began = time.perf_counter()
    proc = subprocess.Popen(
        command, cwd=repo, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    metrics, first_step = out / "metrics.jsonl", None
    while proc.poll() is None:
        if first_step is None and metrics.is_file() and metrics.stat().st_size > 0:
            first_step = time.perf_counter() - began
        time.sleep(0.1)
    output = proc.stdout.read() if proc.stdout else ""
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    warmup = summary.get("warmup", {})
    return {
        "exit": proc.returncode,
        "first_step_s": round(first_step, 1) if first_step else None,
        "launch_s": round(time.perf_counter() - began, 1),
        "compile_cache": [line for line in output.splitlines() if line.startswith("compile cache:")][-1:],
        "reported": [line for line in output.splitlines() if " in " in line and "exit" in line][-1:],
        "worker_fxgraph_miss": warmup.get("fxgraph_cache_miss"),
        "worker_fxgraph_hit": warmup.get("fxgraph_cache_hit"),
        "worker_warmup_s": warmup.get("seconds"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[2])
    args = parser.parse_args()
    home = args.workdir / "home"
    rows = {
        "cold": launch(args.repo, home, args.workdir / "out-cold", []),
        "warm, optim.lr and eval.every changed": launch(
            args.repo, home, args.workdir / "out-warm", ["optim.lr=1e-3", "eval.every=2"]
        ),
    }
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
