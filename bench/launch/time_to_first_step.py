"""Seconds from `dflash-doctor train` to the first metrics line, cold then warm, with each launch's timeline
(issue 40 §2): a cold launch in a fresh DFLASH_DOCTOR_HOME (nothing compiled, no kept probe), then the same
launch again in that home (warm). The first step is timed from outside (the first line of metrics.jsonl)
and, where the checkout records one, split into the launch timeline's phases (`run.timeline` of --json).

    .venv/bin/python -m bench.launch.time_to_first_step --workdir /tmp/ttfs [--config tiny-cpu] [--repo PATH]
    .venv/bin/python -m bench.launch.time_to_first_step --workdir /tmp/ttfs --config qwen3-8b-b16   # on a GPU

`--repo` runs another checkout (its packages first on PYTHONPATH, with this interpreter), for a before/after
on the same machine. `--compare-warm-up` runs a one-process launch both ways in one run, each in a home of its
own, interleaved (separate cold, lone cold, separate warm, lone warm; `--rounds N` alternates which goes first) so
that a loaded machine's drift falls on both: the separate warm-up child then the rank (`DFLASH_DOCTOR_SEPARATE_WARM_UP=1`), and the lone rank that is
its own warm-up, started beside the gate (dflash_doctor/launch/lone_rank.py); it prints the lone/separate ratios. `--only cold|warm` runs one launch (`--home` an existing home: the first launch of a
second config, its cache warm for another). Each launch runs with DFLASH_DOCTOR_DEBUG=1 (an internal error
prints its traceback), its stdout and stderr kept beside its output folder (`out-cold.stdout.json`,
`out-cold.stderr.txt`), the stderr's tail in the JSON when it did not end 0. Prints a table; writes JSON
(default bench/results/time_to_first_step.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dflash_base.atomic import write_json_atomic

ROOT = Path(__file__).resolve().parents[2]
# tiny-cpu cut to a few seconds of training: the launch is what is measured, not the run
TINY = [
    "data.seq_len=64",
    "data.num_samples=32",
    "optim.batch_size=2",
    "optim.anchors=8",
    "checkpoint.every=0",
]


STDERR_TAIL_CHARS = 6000  # enough for a whole traceback (the H200's exit 3 of S12 came back with none)


SEPARATE_ENV = "DFLASH_DOCTOR_SEPARATE_WARM_UP"  # dflash_doctor/launch/lone_rank.py: the way back
ARMS = {"separate": {SEPARATE_ENV: "1"}, "lone": {SEPARATE_ENV: "0"}}  # --compare-warm-up


def launch(
    repo: Path, home: Path, out: Path, config: str, sets: list[str], extra: dict[str, str] | None = None
) -> dict[str, Any]:
    """One `train --json` launch; the first metrics line's time seen from outside, and its timeline."""
    command = [sys.executable, "-m", "dflash_doctor", "train", "--config", config, "--json"]
    sets = [*sets, f"output.dir={json.dumps(str(out))}"]
    command += [arg for item in sets for arg in ("--set", item)]
    return run_launch(command, repo, {**launch_environ(repo, home), **(extra or {})}, out)


def launch_environ(repo: Path, home: Path) -> dict[str, str]:
    """The launch's environment: its own home, the checkout first on the path, then whatever the caller put
    there (carried wheels, say); DFLASH_DOCTOR_DEBUG: an internal error (exit 3) prints its traceback."""
    environ = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", SEPARATE_ENV)}
    path = os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH", "")) if p)
    environ.update(DFLASH_DOCTOR_HOME=str(home), PYTHONPATH=path, COLUMNS="200", DFLASH_DOCTOR_DEBUG="1")
    return environ


def run_launch(command: list[str], cwd: Path, environ: dict[str, str], out: Path) -> dict[str, Any]:
    """Run one launch to its end. Both streams go to files beside `out`, read once it ended: stdout was a pipe
    read only then, and on the H200 the `--json` document is 127 kB (the environment lock of 201
    distributions), twice what a pipe holds, so the launcher blocked on its last write until killed."""
    metrics = out / "metrics.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    stdout_path = out.parent / f"{out.name}.stdout.json"
    stderr_path = out.parent / f"{out.name}.stderr.txt"
    began = time.perf_counter()
    with stdout_path.open("wb") as stdout, stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(command, cwd=cwd, env=environ, stdout=stdout, stderr=stderr)
        first_step = wait_for_first_step(proc, metrics, began)
    launch_s = time.perf_counter() - began
    try:
        document = json.loads(stdout_path.read_text(errors="replace"))
    except json.JSONDecodeError:
        document = {}
    run = document.get("run", {}) if isinstance(document, dict) else {}
    timeline = run.get("timeline") or {}
    failed = {"stderr_tail": stderr_path.read_text(errors="replace")[-STDERR_TAIL_CHARS:]}
    return {
        "exit": proc.returncode,
        "status": run.get("status"),
        "first_step_s": round(first_step, 2) if first_step else None,
        "launch_s": round(launch_s, 2),
        "phases": {row["phase"]: row["seconds"] for row in timeline.get("phases", [])},
        # the gate and the probe beside a lone rank started early (not on the path): their own seconds
        "beside": {row["phase"]: row["seconds"] for row in timeline.get("beside", [])},
        "probe_s": timeline.get("probe_s"),
        "inside": timeline.get("inside"),  # when the gate's own steps ended, seconds from the start
        "notes": run.get("notes", []),
        "stderr": str(stderr_path),
        **({} if proc.returncode == 0 else failed),
    }


def wait_for_first_step(proc: subprocess.Popen[bytes], metrics: Path, began: float) -> float | None:
    """Seconds from the launch until the run's metrics file first holds a line (polled every 50 ms)."""
    first_step = None
    while proc.poll() is None:
        if first_step is None and metrics.is_file() and metrics.stat().st_size > 0:
            first_step = time.perf_counter() - began
        time.sleep(0.05)
    return first_step


def table(rows: dict[str, dict[str, Any]]) -> str:
    phases = list(dict.fromkeys(p for row in rows.values() for p in row["phases"]))
    beside = list(dict.fromkeys(p for row in rows.values() for p in row.get("beside", {})))
    head = ["launch", "exit", "first step s", *phases, *(f"({p}, beside)" for p in beside)]
    lines = [head]
    for name, row in rows.items():
        lines.append(
            [
                name,
                str(row["exit"]),
                str(row["first_step_s"]),
                *(f"{row['phases'][p]:.2f}" if p in row["phases"] else "-" for p in phases),
                *(f"{row['beside'][p]:.2f}" if p in row.get("beside", {}) else "-" for p in beside),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in lines)


def ratios(rows: dict[str, dict[str, Any]], names: tuple[str, ...], rounds: int = 1) -> str:
    """The lone rank's time to the first step over the separate warm-up's, per launch (cold, warm) and round;
    with several rounds, the median ratio too."""
    lines = []
    for name in names:
        each = []
        for r in range(rounds):
            tag = "" if rounds == 1 else f", round {r + 1}"
            separate = rows[f"{name} (separate{tag})"]["first_step_s"]
            lone = rows[f"{name} (lone{tag})"]["first_step_s"]
            if separate and lone:
                each.append(lone / separate)
                lines.append(
                    f"{name}{tag}: lone rank {lone:.1f} s / separate warm-up {separate:.1f} s = {lone / separate:.2f}x"
                )
            else:
                lines.append(f"{name}{tag}: no first step in one of the two (see the rows' exit and stderr)")
        if len(each) > 1:
            lines.append(f"{name}: median {statistics.median(each):.2f}x over {len(each)} rounds")
    return "\n".join(lines)


def compare_warm_up(
    args: argparse.Namespace, names: tuple[str, ...], sets: list[str]
) -> dict[str, dict[str, Any]]:
    """Both arms in fresh homes of their own, launch by launch: separate then lone in odd rounds, lone then
    separate in even ones, so that neither always runs first on a machine whose load drifts. `import torch`
    once before, untimed: the first process after a long idle reads torch from disk, whichever arm it is."""
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    rows: dict[str, dict[str, Any]] = {}
    for r in range(args.rounds):
        tag = "" if args.rounds == 1 else f", round {r + 1}"
        arms = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))
        for name in names:
            for arm in arms:
                where = f"{arm}-{r + 1}" if args.rounds > 1 else arm
                rows[f"{name} ({arm}{tag})"] = launch(
                    args.repo.resolve(),
                    args.workdir / f"home-{where}",
                    args.workdir / f"out-{name}-{where}",
                    args.config,
                    sets,
                    ARMS[arm],
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True, help="a fresh folder: homes and outputs")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the checkout to run (default: this one)")
    parser.add_argument("--config", default="tiny-cpu")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="more overrides")
    parser.add_argument(
        "--steps", type=int, default=3, help="optim.steps (the launch, not the run, is measured)"
    )
    parser.add_argument(
        "--only", choices=("cold", "warm", "both"), default="both", help="which launches (default: both)"
    )
    parser.add_argument(
        "--home",
        type=Path,
        default=None,
        help="the DFLASH_DOCTOR_HOME (default: WORKDIR/home, fresh); another config's home makes the cold "
        "launch the first of a second config",
    )
    parser.add_argument(
        "--compare-warm-up",
        action="store_true",
        help="a one-process config both ways, interleaved: the separate warm-up child, and the lone rank as its "
        "own warm-up (each in a fresh home of its own under WORKDIR)",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="with --compare-warm-up: rounds, the arms' order alternating"
    )
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "time_to_first_step.json")
    args = parser.parse_args()
    sets = [*(TINY if args.config.startswith("tiny-cpu") else []), f"optim.steps={args.steps}", *args.sets]
    home = args.home if args.home is not None else args.workdir / "home"
    names = ("cold", "warm") if args.only == "both" else (args.only,)
    if args.compare_warm_up:
        rows = compare_warm_up(args, names, sets)
    else:
        rows = {
            name: launch(args.repo.resolve(), home, args.workdir / f"out-{name}", args.config, sets)
            for name in names
        }
    print(table(rows))
    if args.compare_warm_up:
        print(ratios(rows, names, args.rounds))
    document = {
        "config": args.config,
        "sets": sets,
        "repo": str(args.repo),
        "home": str(home) if not args.compare_warm_up else str(args.workdir / "home-<arm>"),
        "launches": rows,
    }
    write_json_atomic(args.json, document)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
