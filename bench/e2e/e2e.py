"""End to end through `dflash-doctor train` (gate, cache warm, torchrun, real transport): what a user gets.

Runs `python -m dflash_doctor train --config <derived config>` as a child and reads the run's
`metrics.jsonl` and `summary.json`:

  steady tok/s        context tokens trained per second over the steps after the first `--skip`
                      (sum of tokens / sum of step times; a step time includes its wait for data)
  data wait fraction  sum(data_wait_s) / sum(step_time_s) over the same steps: how long the drafter
                      sat waiting for the target (0: the target keeps up; near 1: the target is the limit)
  time to first step  from launching the command to the first metrics line (gate + cache warm + torchrun
                      start + target build + drafter warm-up + step 1), seen by polling the file
  peak memory / role  the trainer does not report it; sampled here from NVML (device memory in use, all
                      processes, including the allocator's cache) every 0.5 s, GPU i = local rank i

`--set` overrides are applied to a copy of the config written beside the run (so the JSON names the exact
config that ran). The topology is the launcher's (`topology.mode`, "auto" in the GPU presets): the row's
`topology` says which ran, e.g. colocated on every GPU, or `--set topology.targets=1 --set
topology.drafters=1` for the 1+1 split. With
`--colocated-json`, the 1+1 tok/s is compared with 2 x the colocated rate of the same recipe.

    python3 -m bench.e2e.e2e --config qwen3-8b-b16 --steps 60 --colocated-json bench/results/colocated.json
    .venv/bin/python -m bench.e2e.e2e --tiny                     # CPU dry run: tiny-cpu, 1+1 over gloo
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.lib.roles import RESULTS, print_rows, write_result
from trainer.runspec.config import load_config
from trainer.runspec.config_file import apply_overrides, config_to_toml, read_raw, resolve_config_path
from trainer.runspec.topology import resolve_topology

COLUMNS = ("recipe", "exit", "steps", "steady_tok_s", "steady_samples_s", "data_wait_fraction",
           "time_to_first_step_s", "x2_colocated_tok_s", "vs_x2_colocated", "wall_s")  # fmt: skip


def derived_config(config: str, overrides: list[str], destination: Path) -> Path:
    """The config with the overrides applied, written as TOML; validated by the trainer's own loader."""
    raw = apply_overrides(read_raw(resolve_config_path(config)), overrides)
    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_text(config_to_toml(raw))
    load_config(destination)  # a bad override fails here, before anything starts
    return destination


class Watcher:
    """Polls the run while it runs: when the first metrics line appears, and NVML memory per GPU."""

    def __init__(self, metrics: Path, began: float) -> None:
        self.metrics, self.began = metrics, began
        self.first_step_s: float | None = None
        self.peak_used_gib: dict[int, float] = {}
        self._stop = threading.Event()
        self._nvml = self._open_nvml()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _open_nvml() -> Any:
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            return pynvml, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception:  # no driver (CPU box) or no nvidia-ml-py: no memory column
            return None

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            if self.first_step_s is None and self.metrics.is_file() and self.metrics.stat().st_size > 0:
                self.first_step_s = time.perf_counter() - self.began
            if self._nvml:
                pynvml, handles = self._nvml
                for index, handle in enumerate(handles):
                    used = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**30
                    self.peak_used_gib[index] = round(max(used, self.peak_used_gib.get(index, 0.0)), 2)


def steady_state(records: list[dict[str, Any]], skip: int) -> dict[str, Any]:
    """Throughput and wait over the steps after the first `skip` (compile and pipeline fill excluded)."""
    steady = records[skip:] or records
    if not steady:
        return {}
    seconds = sum(r["step_time_s"] for r in steady)
    tokens = sum(r["tok_s"] * r["step_time_s"] for r in steady)
    samples = sum(r["samples_s"] * r["step_time_s"] for r in steady)
    waited = sum(r["data_wait_s"] for r in steady)
    return {
        "steady_steps": len(steady),
        "steady_tok_s": round(tokens / seconds, 1),
        "steady_samples_s": round(samples / seconds, 4),
        "data_wait_fraction": round(waited / seconds, 4),
        "median_step_s": round(statistics.median(r["step_time_s"] for r in steady), 4),
        "median_wait_s": round(statistics.median(r["data_wait_s"] for r in steady), 4),
        "first_step_time_s": round(records[0]["step_time_s"], 3),
    }


def colocated_rate(path: Path | None, recipe: str, cfg: Any) -> float | None:
    """2 x the colocated tok/s of this recipe at the same shapes, from bench/kernels/colocated.py (else None)."""
    if path is None or not path.is_file():
        return None
    shapes = {"seq_len": cfg.data.seq_len, "anchors": cfg.optim.anchors,
              "block_size": cfg.drafter.block_size, "batch_size": cfg.optim.batch_size}  # fmt: skip
    for row in json.loads(path.read_text()).get("rows", []):
        same = all(row.get("shapes", {}).get(k) == v for k, v in shapes.items())
        if row.get("recipe") == recipe and same:
            return row["x2_colocated_tok_s"]
    return None


def stop_group(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM the child's whole session (train, torchrun, workers), SIGKILL after 20 s; its exit code."""
    for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def role_memory(peaks: dict[int, float], topology: dict[str, Any]) -> dict[str, float]:
    """NVML peaks named by the role of the rank on that GPU (GPU i = rank i on one node)."""
    if topology.get("mode") == "colocated":
        return {f"colocated_gpu{i}": gib for i, gib in sorted(peaks.items())}
    targets = int(topology.get("targets", 1))
    return {f"{'target' if i < targets else 'drafter'}_gpu{i}": gib for i, gib in sorted(peaks.items())}


STARTUP_MARKERS = ("compile cache:", "warm-up", "before torchrun:", "ready in")


def startup_lines(log: str) -> list[str]:
    """The launcher's and the ranks' own start-up lines: where the time to first step went."""
    return [line.strip() for line in log.splitlines() if any(m in line for m in STARTUP_MARKERS)][:20]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default="qwen3-8b-b16")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="section.key=value")
    parser.add_argument("--skip", type=int, default=None, help="steps left out of the steady state")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/dflash-e2e"))
    parser.add_argument(
        "--no-deep", action="store_true", help="pass --no-deep to train (skip the deep probe)"
    )
    parser.add_argument("--no-force", action="store_true", help="let a failing gate finding stop the run")
    parser.add_argument("--timeout-s", type=float, default=400)
    parser.add_argument("--colocated-json", type=Path, default=RESULTS / "colocated.json")
    parser.add_argument("--tiny", action="store_true", help="CPU dry run: tiny-cpu, 1+1 over gloo")
    parser.add_argument("--out", type=Path, default=None, help="default bench/results/e2e-<recipe>.json")
    parser.add_argument(
        "--keep-output", action="store_true",
        help="keep the run's output folder (a b16 run leaves ~14 GB: a checkpoint and an export)",
    )  # fmt: skip
    args = parser.parse_args()

    config = "tiny-cpu" if args.tiny else args.config
    recipe = Path(config).name.removesuffix(".toml")
    output_dir = args.workdir / recipe
    overrides = [
        f"optim.steps={args.steps}",
        f'output.dir="{output_dir}"',
        "checkpoint.every=0",
        *(["run.log_every=5", "data.seq_len=256", "optim.anchors=16"] if args.tiny else []),  # = colocated
        *args.overrides,
    ]
    derived = derived_config(config, overrides, args.workdir / f"{recipe}.toml")
    shutil.rmtree(output_dir, ignore_errors=True)  # a checkpoint left there would make the run resume
    command = [sys.executable, "-m", "dflash_doctor", "train", "--config", str(derived)]
    command += ["--no-deep"] * args.no_deep + ["--force"] * (not args.no_force)
    cfg = load_config(derived)

    began = time.perf_counter()
    log_path = args.workdir / f"{recipe}.log"
    with Watcher(output_dir / "metrics.jsonl", began) as watcher, open(log_path, "w") as log:
        # Its own session, so torchrun and its workers can be stopped together (and never outlive us).
        proc = subprocess.Popen(
            # Wide lines: the launcher's rich output is not wrapped, so each start-up line is one line.
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "200"},
            start_new_session=True,
        )
        signal.signal(signal.SIGTERM, lambda *_: (stop_group(proc), sys.exit(143)))
        try:
            code = proc.wait(timeout=args.timeout_s)
        except subprocess.TimeoutExpired:
            code = stop_group(proc) or -9
    wall = time.perf_counter() - began

    from trainer.runspec.outputs import metrics_path, read_metrics

    records = read_metrics(metrics_path(output_dir))
    summary_path = output_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    # what ran: the summary's topology (the launcher resolves topology.mode = "auto" for the GPUs present)
    topology = summary.get("topology") or resolve_topology(cfg.topology).to_json()
    skip = args.skip if args.skip is not None else max(3, len(records) // 10)
    stats = steady_state(records, skip)
    x2 = colocated_rate(args.colocated_json, recipe, cfg)
    row: dict[str, Any] = {
        "recipe": recipe,
        "command": command,
        "overrides": overrides,
        "exit": code,
        "steps": len(records),
        **stats,
        "time_to_first_step_s": round(watcher.first_step_s, 1) if watcher.first_step_s else None,
        "warmup": summary.get("warmup"),
        "topology": topology,
        "peak_memory_gib_nvml": role_memory(watcher.peak_used_gib, topology),
        "x2_colocated_tok_s": x2,
        "vs_x2_colocated": round(stats["steady_tok_s"] / x2, 3) if x2 and stats else None,
        "wall_s": round(wall, 1),
        # the trainer's own figure (tokens / seconds over its steady steps), beside this script's
        "trainer_steady_tok_s": summary.get("steady_tok_s"),
        "trainer_steady_steps": summary.get("steady_steps"),
        "summary": summary,
        "log_tail": log_path.read_text()[-4000:],
    }
    row["startup"] = startup_lines(log_path.read_text())
    out = args.out or RESULTS / f"e2e-{recipe}.json"
    write_result(out, row)
    if not args.keep_output:  # a full disk stops a GPU machine: four b16 runs left 56 GB
        shutil.rmtree(output_dir, ignore_errors=True)

    shape = (
        f"colocated x{topology['drafters']}"
        if topology.get("mode") == "colocated"
        else f"{topology.get('targets')}+{topology.get('drafters')}"
    )
    print_rows(f"end to end: dflash-doctor train ({shape})", COLUMNS, [row])
    print("start-up:", *row["startup"], sep="\n  ")
    print(f"peak memory (NVML, GiB): {row['peak_memory_gib_nvml'] or 'not available'}")
    if code != 0:
        print(f"train exited {code}; log tail:\n{row['log_tail'][-1500:]}")
    print(f"wrote {out}")
    return 0 if code == 0 and records else 1


if __name__ == "__main__":
    raise SystemExit(main())
