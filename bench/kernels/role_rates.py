"""Fill `dflash_doctor/data/role_rates.json` (what dflash_doctor/launch/split.py reads) from a GPU run's results.

Target rate: the `capture +compiled` row (else `capture`) of `<--results>/target_capture.json` at the recipe's sequence length. Drafter rate:
the chosen row (`--variant`, default "trainer": what the trainer runs today) of `<--results>/drafter_variants.json`; a
recipe whose preset runs something else names its row with `--recipe-variant RECIPE=VARIANT` (repeatable).
Prints the recommended split on `--gpus` GPUs per recipe, with the drafter's best variant alongside.
`--colocated bench/results/topology.json` (bench/suites/topology.sh) also writes each recipe's measured colocated
rate: the steady samples/s of its one-GPU colocated `dflash-doctor train` run (else the recipe keeps its
`colocated_samples_s`, or null: projected from the two role rates).

    python3 -m bench.kernels.role_rates --results bench/results --gpus 8
    python3 -m bench.kernels.role_rates --results bench/results/h200 --gpus 8 --recipe-variant 'seed-b32=flex fwd TMA'
    python3 -m bench.kernels.role_rates --results bench/results/h200 --recipe-variant 'seed-b32=flex fwd TMA' \
        --colocated bench/results/h200/topology.json
"""

from __future__ import annotations

import argparse
import json
from datetime import date
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.lib.roles import RESULTS, write_result
from dflash_doctor.launch.split import DEFAULT_RATES_PATH, RoleRates, project_colocated, recommend_split


def recipe_variants(variants: dict[str, Any], pairs: list[str]) -> dict[str, str]:
    """`RECIPE=VARIANT` strings -> {recipe: variant}, each checked against drafter_variants.json's recipes and rows.

    Raises ValueError naming what exists when a recipe or a variant is unknown (or a string has no `=`)."""
    recipes = list(variants.get("recipes", {}))
    chosen: dict[str, str] = {}
    for pair in pairs:
        recipe, sep, variant = pair.partition("=")
        recipe, variant = recipe.strip(), variant.strip()
        if not sep or not recipe or not variant:
            raise ValueError(f"--recipe-variant {pair!r}: expected RECIPE=VARIANT")
        if recipe not in recipes:
            raise ValueError(
                f"--recipe-variant {pair!r}: no recipe {recipe!r}; recipes: {', '.join(recipes)}"
            )
        names = [r["variant"] for r in variants.get("rows", []) if r["recipe"] == recipe]
        if variant not in names:
            raise ValueError(
                f"--recipe-variant {pair!r}: recipe {recipe!r} has no variant {variant!r}; "
                f"variants: {', '.join(repr(n) for n in names) or '(none)'}"
            )
        chosen[recipe] = variant
    return chosen


def measured_rates(
    capture: dict[str, Any],
    variants: dict[str, Any],
    variant: str,
    per_recipe: dict[str, str] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """(role_rates.json's recipes table, the fastest drafter samples/s per recipe).

    The drafter rate comes from the `variant` row, or from `per_recipe[recipe]`'s row where the recipe is named there."""
    per_recipe = per_recipe or {}
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
        row_name = per_recipe.get(name, variant)
        chosen = next((r for r in rows if r["variant"] == row_name), None)
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
                f"bench/kernels/target_capture.py '{target_variant}' row, drafter = bench/kernels/drafter_variants.py '{row_name}' row"
            ),
        }
        fastest[name] = max(r["samples_s"] for r in rows)
    return table, fastest


def colocated_rates(topology: dict[str, Any], when: str) -> dict[str, dict[str, Any]]:
    """{recipe: its colocated_samples_s and source} from bench/e2e/topology_table.py's rows: one-GPU colocated
    runs that finished, at their steady state."""
    out: dict[str, dict[str, Any]] = {}
    for row in topology.get("rows", []):
        if row.get("topology") == "colocated x1" and row.get("exit") == 0 and row.get("steady_samples_s"):
            out[row["recipe"]] = {
                "colocated_samples_s": row["steady_samples_s"],
                "colocated_source": (
                    f"measured {when}: dflash-doctor train colocated on one GPU, steady state "
                    f"(bench/suites/topology.sh run {row['run']!r})"
                ),
            }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder with the GPU run's JSON")
    parser.add_argument("--variant", default="trainer", help="the drafter row to take the rate from")
    parser.add_argument(
        "--recipe-variant",
        action="append",
        default=[],
        metavar="RECIPE=VARIANT",
        help="the drafter row for one recipe (repeatable; the others take --variant's)",
    )
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument(
        "--colocated",
        type=Path,
        default=None,
        help="bench/suites/topology.sh's topology.json: colocated rates",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_RATES_PATH)
    args = parser.parse_args()

    capture = json.loads((args.results / "target_capture.json").read_text())
    variants = json.loads((args.results / "drafter_variants.json").read_text())
    try:
        per_recipe = recipe_variants(variants, args.recipe_variant)
    except ValueError as exc:
        parser.error(str(exc))  # exits 2
    table, fastest = measured_rates(capture, variants, args.variant, per_recipe)
    for name in per_recipe.keys() - table.keys():
        print(f"{name}: no capture row at its sequence length: not written")
    if not table:
        print("no recipe has both a capture row and a drafter row: role_rates.json left as it is")
        return 1
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    old = previous.get("recipes", {})
    merged = {**old, **{name: {**old.get(name, {}), **entry} for name, entry in table.items()}}
    if args.colocated is not None:
        measured = colocated_rates(
            json.loads(args.colocated.read_text()), f"{date.today()} on {variants.get('device')}"
        )
        for name, entry in measured.items():
            if name in merged:
                merged[name] = {**merged[name], **entry}
                table.setdefault(name, merged[name])
    write_result(args.out, {"note": previous.get("note", ""), "recipes": merged})

    view = Table(title=f"projected best split on {args.gpus} GPUs (min(N x target, M x drafter))")
    columns = ("recipe", "drafter row", "target/GPU", "drafter/GPU", "best", "Ktok/s", "with fastest drafter",
               "colocated Ktok/s")  # fmt: skip
    for column in columns:
        view.add_column(column, justify="right")
    for name in table:
        entry = merged[name]
        rates = RoleRates.from_json(name, entry)
        best = recommend_split(rates, args.gpus).best
        faster = RoleRates.from_json(
            name, {**entry, "drafter_samples_s": fastest.get(name, rates.drafter_samples_s)}
        )
        colocated = project_colocated(rates, args.gpus)
        alt = recommend_split(faster, args.gpus).best
        view.add_row(
            name,
            per_recipe.get(name, args.variant),
            f"{rates.target_samples_s:.3f}",
            f"{rates.drafter_samples_s:.3f}",
            f"{best.targets}+{best.drafters}",
            f"{best.tok_s / 1000:.1f}",
            f"{alt.targets}+{alt.drafters} {alt.tok_s / 1000:.1f} Ktok/s",
            f"{colocated.tok_s / 1000:.1f} ({'measured' if colocated.measured else 'projected'})",
        )
    Console(width=150).print(view)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
