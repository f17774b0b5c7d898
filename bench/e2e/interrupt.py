"""Stop a real `dflash-doctor train` with SIGTERM or SIGINT mid-training and check that nothing is left.

Per signal: launch `train` (in a session of its own, as a scheduler would), wait for the first steps in
`metrics.jsonl`, remember every process of the launcher's tree, send the signal to the launcher alone,
then report: the exit code (expected 128+signal), the seconds from the signal to the launcher's exit, the
processes of the tree still alive afterwards (expected none), the GPU processes left (nvidia-smi, expected
none), the record's status (expected `interrupted`) and its last metrics, and whether a traceback reached
the terminal. Prints a table; writes JSON.

    python -m bench.e2e.interrupt --config tiny-cpu --signals TERM,INT            # CPU, here
    bash bench/suites/interrupt_x2.sh                                                 # 2 H200s, qwen3-8b-b16
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dflash_doctor.launch.supervise import ProcessTree  # the repo's copy

REPO = Path(__file__).resolve().parents[2]


def gpu_processes() -> list[str] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    done = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [line for line in done.stdout.splitlines() if line.strip()]


def one_stop(
    config: str, signum: int, steps_first: int, overrides: list[str], limit_s: float
) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="dflash-interrupt-"))
    args = [
        "train",
        "--config",
        config,
        "--force",
        "--set",
        f"output.dir='{out}'",
        "--set",
        "optim.steps=100000",
    ]
    args += [a for item in overrides for a in ("--set", item)]
    began = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dflash_doctor", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    tree = ProcessTree(proc.pid)  # the launcher and every descendant seen while it runs
    metrics = out / "metrics.jsonl"
    try:
        while time.monotonic() - began < limit_s and proc.poll() is None:
            tree.refresh()
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= steps_first:
                break
            time.sleep(0.25)
        reached = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
        to_first_steps = time.monotonic() - began
        signalled = time.monotonic()
        proc.send_signal(signum)
        output, _ = proc.communicate(timeout=limit_s)
        stop_s = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            output, _ = proc.communicate()
            stop_s = float("nan")
    time.sleep(1.0)
    left = tree.alive()
    tree.kill_all()  # the benchmark leaves nothing behind either
    home = Path(os.environ.get("DFLASH_DOCTOR_HOME", ""))
    records = sorted((home / "state" / "runs").glob("*/record.json"), key=lambda p: p.stat().st_mtime)
    record = json.loads(records[-1].read_text()) if records else {}
    return {
        "signal": signal.Signals(signum).name,
        "steps_before_signal": reached,
        "seconds_to_signal": round(to_first_steps, 1),
        "exit_code": proc.returncode,
        "expected_exit_code": 128 + signum,
        "seconds_signal_to_exit": round(stop_s, 2),
        "processes_seen": len(tree.known) - 1,  # the launcher's descendants
        "processes_left": [p.pid for p in left],
        "gpu_processes_after": gpu_processes(),
        "record_status": record.get("status"),
        "record_exit_code": record.get("exit_code"),
        "record_metrics": record.get("metrics"),
        "record_notes": record.get("notes", [])[-2:],
        "traceback_on_terminal": "Traceback" in output,
        "output_tail": output.splitlines()[-6:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny-cpu")
    parser.add_argument("--signals", default="TERM,INT")
    parser.add_argument(
        "--steps-first", type=int, default=3, help="metrics lines to wait for before the signal"
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--limit-s", type=float, default=400.0)
    parser.add_argument("--json", default=str(REPO / "bench" / "results" / "interrupt.json"))
    args = parser.parse_args()
    os.environ.setdefault("DFLASH_DOCTOR_HOME", tempfile.mkdtemp(prefix="dflash-interrupt-home-"))
    rows = []
    for name in args.signals.split(","):
        signum = getattr(signal, f"SIG{name.strip().upper()}")
        rows.append(one_stop(args.config, signum, args.steps_first, args.overrides, args.limit_s))
    header = f"{'signal':8} {'steps':>5} {'exit':>5} {'want':>5} {'stop s':>7} {'seen':>5} {'left':>5} {'record':12} tb"
    print(header)
    for r in rows:
        print(
            f"{r['signal']:8} {r['steps_before_signal']:>5} {r['exit_code']!s:>5} {r['expected_exit_code']:>5} "
            f"{r['seconds_signal_to_exit']:>7} {r['processes_seen']:>5} {len(r['processes_left']):>5} "
            f"{r['record_status']!s:12} {r['traceback_on_terminal']}"
        )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"config": args.config, "runs": rows}, indent=1) + "\n")
    ok = all(
        r["exit_code"] == r["expected_exit_code"]
        and not r["processes_left"]
        and r["record_status"] == "interrupted"
        for r in rows
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
