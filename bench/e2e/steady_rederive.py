"""Re-state the figures built on the old steady window (issue 40 §1) from the data kept in bench/results.

The old window was every step after the first five, the last step included (and the steps around an
evaluation or a checkpoint). The new one counts whole pipelined steps only (`trainer.run.steady`). Where a
run's raw step times are kept (a metrics.jsonl copy), the figure is re-derived exactly. Where only a summary
is kept, it cannot be: the figure is marked "not re-measured", beside what the kept median step implies
(tokens a step / median step: a constant-token recipe, a median over the e2e window that still holds the
short last step, so an indication, not the figure).

    python -m bench.e2e.steady_rederive [--out bench/results/steady_rederived.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from dflash_base.atomic import write_json_atomic
from dflash_doctor.launch.split import GradientSync, RoleRates, load_role_rates, project_colocated
from trainer.run.steady import steady_window

RESULTS = Path(__file__).resolve().parents[1] / "results"
H200 = RESULTS / "h200"
# metrics.jsonl copies, with the checkpoint interval of the config they ran (smollm2-135m: every 200)
RAW_RUNS = {
    "smollm2-135m S8 (318 steps)": ("smollm2-135m-metrics.jsonl", 200),
    "smollm2-135m S9 (732 steps)": ("smollm2-135m-s9-metrics.jsonl", 200),
    "smollm2-135m S10 (1,887 steps)": ("smollm2-135m-s10-metrics.jsonl", 200),
}
# Summary-only figures: (file, key path, tokens a step)
SUMMARY_ONLY = {
    "qwen3-8b-b16 colocated, overlap step": ("throughput.json", ("b16_step",), 3072),
    "qwen3-8b-b16 colocated, overlap off": ("throughput.json", ("b16_default",), 3072),
    "seed-b32 colocated, no flags (S9)": ("step-s9-b32.json", (), 40000),
}
GRADIENT_BYTES = int(4 * 1.0475e9)  # the drafter's 1.05B fp32 gradients at Qwen3-8B shapes (4.19 GB)


def old_window(records: list[dict[str, Any]]) -> float:
    """The old figure: tokens / seconds over every step after the first five."""
    kept = records[5:] if len(records) >= 10 else records[1:]
    return sum(r["tokens"] for r in kept) / sum(r["step_time_s"] for r in kept)


def raw_rows() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (file, every) in RAW_RUNS.items():
        records = [json.loads(line) for line in (H200 / file).read_text().splitlines()]
        new = steady_window(records, checkpoint_every=every)
        out[name] = {
            "source": f"bench/results/h200/{file}",
            "old_tok_s": round(old_window(records), 1),
            "new_tok_s": round(new["steady_tok_s"], 1),
            "new_steps": new["steady_step_count"],
            "left_out": new["steady_left_out"],
            "status": "re-derived",
        }
    return out


def summary_rows() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (file, path, tokens) in SUMMARY_ONLY.items():
        row: Any = json.loads((H200 / file).read_text())
        for key in path:
            row = row[key]
        median = row["median_step_s"]
        out[name] = {
            "source": f"bench/results/h200/{file}",
            "old_tok_s": round(row["trainer_steady_tok_s"], 1),
            "old_steps": row["trainer_steady_steps"],
            "new_tok_s": None,
            "status": "not re-measured (no per-step times kept)",
            "median_step_s": median,
            "median_implied_tok_s": round(tokens / median, 1),
        }
    return out


def projection(rates: RoleRates, per_gpu_samples_s: float) -> float:
    """8 colocated H200s at these rates, the gradient all-reduce counted (BENCHMARKS 4.0's projection)."""
    changed = RoleRates(**{**rates.__dict__, "colocated_samples_s": per_gpu_samples_s})
    sync = GradientSync(GRADIENT_BYTES, sequences_per_step=1)
    return project_colocated(changed, 8, sync).tok_s


def projection_rows(summaries: dict[str, Any]) -> dict[str, Any]:
    b32 = load_role_rates()["seed-b32"]
    implied = summaries["seed-b32 colocated, no flags (S9)"]["median_implied_tok_s"] / b32.seq_len
    assert b32.colocated_samples_s is not None
    return {
        "8 x H200 colocated, seed-b32": {
            "old_tok_s": round(projection(b32, b32.colocated_samples_s), 1),
            "new_tok_s": None,
            "status": "not re-measured (its one-GPU rate is not)",
            "median_implied_tok_s": round(projection(b32, implied), 1),
        }
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "steady_rederived.json")
    args = parser.parse_args()
    summaries = summary_rows()
    document = {
        "note": __doc__.split("\n\n")[0].replace("\n", " "),
        "raw": raw_rows(),
        "summary_only": summaries,
        "projection": projection_rows(summaries),
    }
    write_json_atomic(args.out, document)
    print(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
