"""Run `dflash-doctor eval` over a prompts file in N shards at once on one device, and merge what they report.

Acceptance is per prompt, so sharding changes no tau or forward count; the shards' wall-clock speed-ups are
measured while they share the device (each shard's own ratio of target-only to speculative time still
compares like with like). Used where one process at batch 1 leaves a GPU mostly idle and a call has minutes.

    python3 -m bench.decode.eval_shards --shards 4 --prompts P.jsonl --out R.json -- --export E --config C
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def merge(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report's totals from the shards': sums of tokens and forwards, tau = emitted tokens / forwards."""

    def one(parts: list[dict[str, Any]]) -> dict[str, Any]:
        forwards = sum(
            r["target_forwards"] - r["prompts"] for r in parts
        )  # verify forwards: the prefills apart
        emitted = sum(r["mean_accept_len"] * (r["target_forwards"] - r["prompts"]) for r in parts)
        histogram = [sum(col) for col in zip(*(r["accept_length_histogram"] for r in parts), strict=True)]
        verify = max(sum(histogram), 1)
        block = len(histogram)
        return {
            "drafter": parts[0]["drafter"],
            "block_size": parts[0]["block_size"],
            "prompts": sum(r["prompts"] for r in parts),
            "new_tokens": sum(r["new_tokens"] for r in parts),
            "mean_accept_len": emitted / max(forwards, 1),
            "target_forwards": sum(r["target_forwards"] for r in parts),
            "baseline_forwards": sum(r["baseline_forwards"] for r in parts),
            "speedup_by_shard": [round(r["speedup"], 3) for r in parts],
            "identical_prompts": sum(sum(p["identical"] for p in r["per_prompt"]) for r in parts),
            "ties": sum(r["ties"] for r in parts),
            "differences": sum(r["differences"] for r in parts),
            "accept_length_histogram": histogram,
            "accept_by_position": [
                sum(histogram[length - 1] for length in range(slot + 1, block + 1)) / verify
                for slot in range(1, block)
            ],
            "dtype": parts[0]["dtype"],
        }

    merged = one(reports)
    if all(r.get("baseline") for r in reports):
        merged["baseline"] = one([r["baseline"] for r in reports])
    return merged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("eval_args", nargs=argparse.REMAINDER, help="-- then the eval options")
    args = parser.parse_args()
    extra = [a for a in args.eval_args if a != "--"]
    lines = [line for line in args.prompts.read_text().splitlines() if line.strip()]
    began = time.perf_counter()
    procs = []
    for i in range(args.shards):
        shard = args.out.parent / f"{args.out.stem}.shard{i}.jsonl"
        shard.write_text("\n".join(lines[i :: args.shards]) + "\n")
        command = [sys.executable, "-m", "dflash_doctor", "eval", "--prompts", str(shard),
                   "--num-prompts", str(len(lines)), "--json", *extra]  # fmt: skip
        err = open(args.out.parent / f"{args.out.stem}.shard{i}.err", "w")  # noqa: SIM115 (closed below)
        procs.append((subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True), err))
    reports, codes = [], []
    for proc, err in procs:
        out, _ = proc.communicate()
        err.close()
        codes.append(proc.returncode)
        if out.strip():
            reports.append(json.loads(out))
    result = {"exit_codes": codes, "seconds": round(time.perf_counter() - began, 1), "shards": reports}
    if reports:
        result["merged"] = merge(reports)
    args.out.write_text(json.dumps(result, indent=1))
    merged = result.get("merged", {})
    for report in (merged, merged.get("baseline") or {}):
        if report:
            print(f"{report['drafter']}: tau {report['mean_accept_len']:.3f} over {report['prompts']} prompts, "
                  f"forwards {report['target_forwards']} vs {report['baseline_forwards']} greedy, "
                  f"speed-up by shard {report['speedup_by_shard']}, differences {report['differences']}")  # fmt: skip
    print(f"exit codes {codes}; wrote {args.out}")
    return max(codes) if codes else 1


if __name__ == "__main__":
    raise SystemExit(main())
