"""Topologies side by side, from `bench/e2e/e2e.py` rows measured in the same call (`bench/suites/topology.sh`).

Each row is one `dflash-doctor train` run; its steady tok/s is compared with the 1+1 split of the same recipe
when the call measured one (`vs_1p1`), and with the projection `train --dry-run` printed for it (`vs_projected`,
from dflash_doctor/data/role_rates.json): a row far from its projection means the rates table needs re-measuring.

    python3 -m bench.e2e.topology_table /tmp/dflash-suite/results/e2e-*.json --out bench/results/topology.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.lib.roles import RESULTS, print_rows, write_result

COLUMNS = ("run", "recipe", "topology", "gpus", "exit", "steady_tok_s", "tok_s_per_gpu", "data_wait_fraction",
           "vs_1p1", "projected_tok_s", "vs_projected", "time_to_first_step_s", "peak_gib")  # fmt: skip


def shape_of(topology: dict[str, Any]) -> tuple[str, int]:
    """('colocated x2', 2) or ('1+1', 2): the topology a row ran and the GPUs it used."""
    if topology.get("mode") == "colocated":
        return f"colocated x{topology['drafters']}", int(topology["drafters"])
    targets, drafters = int(topology.get("targets", 0)), int(topology.get("drafters", 0))
    return f"{targets}+{drafters}", targets + drafters


def projected_tok_s(row: dict[str, Any], topology: dict[str, Any]) -> float | None:
    """What the rates table projects for this recipe and topology (None without rates at its shapes)."""
    from dflash_doctor.launch.split import load_role_rates, project_colocated, project_split

    shapes = row.get("summary", {}).get("warmup", {}).get("shapes", {})
    key = (shapes.get("seq_len"), shapes.get("anchors"), shapes.get("block_size"))
    rates = next((r for r in load_role_rates().values() if (r.seq_len, r.anchors, r.block_size) == key), None)
    if rates is None:
        return None
    if topology.get("mode") == "colocated":
        return project_colocated(rates, int(topology["drafters"])).tok_s
    return project_split(rates, int(topology["targets"]), int(topology["drafters"])).tok_s


def table(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for name, row in rows.items():
        topology = row.get("topology") or row.get("summary", {}).get("topology") or {}
        shape, gpus = shape_of(topology) if topology else ("?", 0)
        tok_s = row.get("steady_tok_s")
        projected = projected_tok_s(row, topology) if topology else None
        peaks = row.get("peak_memory_gib_nvml") or {}
        out.append(
            {
                "run": name,
                "recipe": row.get("recipe"),
                "topology": shape,
                "gpus": gpus,
                "exit": row.get("exit"),
                "steady_tok_s": tok_s,
                "steady_samples_s": row.get("steady_samples_s"),
                "tok_s_per_gpu": round(tok_s / gpus, 1) if tok_s and gpus else None,
                "data_wait_fraction": row.get("data_wait_fraction"),
                "projected_tok_s": round(projected, 1) if projected else None,
                "vs_projected": round(tok_s / projected, 3) if tok_s and projected else None,
                "time_to_first_step_s": row.get("time_to_first_step_s"),
                "peak_gib": max(peaks.values()) if peaks else None,
            }
        )
    for entry in out:  # against the 1+1 split of the same recipe, measured in this call
        split = next((o for o in out if o["recipe"] == entry["recipe"] and o["topology"] == "1+1"), None)
        ok = split and split["steady_tok_s"] and entry["steady_tok_s"]
        entry["vs_1p1"] = round(entry["steady_tok_s"] / split["steady_tok_s"], 3) if ok else None
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("rows", nargs="+", type=Path, help="bench/e2e/e2e.py JSON files (one run each)")
    parser.add_argument("--out", type=Path, default=RESULTS / "topology.json")
    args = parser.parse_args()
    rows = {p.stem: json.loads(p.read_text()) for p in args.rows if p.is_file()}
    if not rows:
        raise SystemExit("topology_table.py: none of the given files exists")
    result = {"rows": table(rows)}
    write_result(args.out, result)
    print_rows("topologies measured in one call (bench/e2e/e2e.py rows)", COLUMNS, result["rows"])
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
