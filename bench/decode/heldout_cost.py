"""What held-out evaluation costs a training run: one evaluation's seconds against the steps between two.

Runs the trainer (`python -m trainer`, the real split topology) on a config with a held-out share and an
evaluation every `--every` steps, reads metrics.jsonl, and projects the share of training time an
evaluation every `--project-every` steps would take (the issue's budget: < 3% at qwen3-8b-b16 with an
evaluation every 500 steps):

    share = eval_s / (project_every * step_s + eval_s)

    python3 -m bench.decode.heldout_cost --config qwen3-8b-b16 --steps 60 --every 20 --heldout 64
    .venv/bin/python -m bench.decode.heldout_cost --config tiny-cpu --steps 20 --every 10 --heldout 16  # CPU

Writes bench/results/heldout_cost[-<tag>].json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.lib.roles import RESULTS, print_rows, write_result
from trainer.runspec.config import load_config

COLUMNS = ("config", "heldout_seqs", "step_s", "eval_s", "eval_per_seq_s", "evals", "share_at_every")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="qwen3-8b-b16")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--heldout", type=int, default=64, help="held-out sequences")
    parser.add_argument("--project-every", type=int, default=500)
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    cfg = load_config(args.config)
    total = cfg.data.num_samples
    out = Path(tempfile.mkdtemp(prefix="heldout-bench-"))
    sets = {
        "optim.steps": args.steps, "eval.every": args.every, "data.eval_fraction": args.heldout / total,
        "checkpoint.every": 0, "output.dir": json.dumps(str(out)),
    }  # fmt: skip
    command = [sys.executable, "-m", "trainer", "--config", args.config]
    command += [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]
    proc = subprocess.run(command, cwd=Path(__file__).resolve().parents[2])
    if proc.returncode:
        return proc.returncode
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steady = [r["step_time_s"] for r in records[1:]]
    evals = [r["heldout_s"] for r in records if r.get("heldout_s") is not None][1:] or [
        r["heldout_s"] for r in records if r.get("heldout_s") is not None
    ]  # the first evaluation compiles the no-grad graphs: left out when there are others
    step_s, eval_s = sum(steady) / len(steady), sum(evals) / len(evals)
    summary = json.loads((out / "summary.json").read_text())
    row = {
        "config": args.config, "heldout_seqs": summary["heldout_sequences"], "step_s": round(step_s, 4),
        "eval_s": round(eval_s, 3), "eval_per_seq_s": round(eval_s / max(summary["heldout_sequences"], 1), 4),
        "evals": len(evals), "share_at_every": round(eval_s / (args.project_every * step_s + eval_s), 4),
    }  # fmt: skip
    print_rows(f"held-out evaluation cost (projected every {args.project_every} steps)", COLUMNS, [row])
    name = f"heldout_cost{'-' + args.tag if args.tag else ''}.json"
    print(f"wrote {write_result(RESULTS / name, {'args': vars(args), 'row': row, 'summary': summary})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
