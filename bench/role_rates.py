"""Fill `dflash_doctor/data/role_rates.json` (what dflash_doctor/split.py reads) from a GPU run's results.

Target rate: the `capture +compiled` row (else `capture`) of bench/target_capture.json at the recipe's sequence length. Drafter rate:
the chosen row (`--variant`, default "trainer": what the trainer runs today) of bench/drafter_variants.json.
Prints the recommended split on `--gpus` GPUs per recipe, with the drafter's best variant alongside.

    python3 bench/role_rates.py --results bench/results --gpus 8
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import date
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.roles import RESULTS, write_result
from dflash_doctor.split import DEFAULT_RATES_PATH, RoleRates, recommend_split


def measured_rates(
    capture: dict[str, Any], variants: dict[str, Any], variant: str
) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """(role_rates.json's recipes table, the fastest drafter samples/s per recipe)."""
    rows = capture.get("rows", [])
    # The row the trainer runs: compiled layers (target.compile_layers defaults to true) when measured.
    target_variant = (
        "capture +compiled" if any(r["variant"] == "capture +compiled" for r in rows) else "capture"
    )
    target = {r["seq_len"]: r["samples_s"] for r in rows if r["variant"] == target_variant}
    table: dict[str, dict[str, Any]] = {}
    fastest: dict[str, float] = {}
    for name, shapes in variants.get("recipes", {}).items():
        rows = [r for r in variants.get("rows", []) if r["recipe"] == name]
        chosen = next((r for r in rows if r["variant"] == variant), None)
        seq_len = shapes["seq_len"]
        if chosen is None or seq_len not in target:  # rates are per sample, whatever the batch
            continue
        table[name] = {
            "seq_len": seq_len,
            "anchors": shapes["anchors"],
            "block_size": shapes["block_size"],
            "target_samples_s": target[seq_len],
            "drafter_samples_s": chosen["samples_s"],
            "source": (
                f"measured {date.today()} on {variants.get('device')} (torch {variants.get('torch')}): target = "
                f"bench/target_capture.py '{target_variant}' row, drafter = bench/drafter_variants.py '{variant}' row"
            ),
        }
        fastest[name] = max(r["samples_s"] for r in rows)
    return table, fastest


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder with the GPU run's JSON")
    parser.add_argument("--variant", default="trainer", help="the drafter row to take the rate from")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--out", type=Path, default=DEFAULT_RATES_PATH)
    args = parser.parse_args()

    capture = json.loads((args.results / "target_capture.json").read_text())
    variants = json.loads((args.results / "drafter_variants.json").read_text())
    table, fastest = measured_rates(capture, variants, args.variant)
    if not table:
        print("no recipe has both a capture row and a drafter row: role_rates.json left as it is")
        return 1
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    merged = {**previous.get("recipes", {}), **table}
    write_result(args.out, {"note": previous.get("note", ""), "recipes": merged})

    view = Table(title=f"projected best split on {args.gpus} GPUs (min(N x target, M x drafter))")
    for column in ("recipe", "target/GPU", "drafter/GPU", "best", "Ktok/s", "with fastest drafter"):
        view.add_column(column, justify="right")
    for name, entry in table.items():
        rates = RoleRates.from_json(name, entry)
        best = recommend_split(rates, args.gpus).best
        faster = RoleRates.from_json(name, {**entry, "drafter_samples_s": fastest[name]})
        alt = recommend_split(faster, args.gpus).best
        view.add_row(
            name,
            f"{rates.target_samples_s:.3f}",
            f"{rates.drafter_samples_s:.3f}",
            f"{best.targets}+{best.drafters}",
            f"{best.tok_s / 1000:.1f}",
            f"{alt.targets}+{alt.drafters} {alt.tok_s / 1000:.1f} Ktok/s",
        )
    Console(width=150).print(view)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
