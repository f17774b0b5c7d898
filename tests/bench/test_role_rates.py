"""bench/kernels/role_rates.py: which drafter row each recipe's rate comes from (--variant, --recipe-variant RECIPE=VARIANT)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.kernels.role_rates import main, measured_rates, recipe_variants
from dflash_doctor.launch.split import load_role_rates

CAPTURE: dict[str, Any] = {
    "rows": [
        {"variant": "capture", "seq_len": 3072, "samples_s": 10.0},
        {"variant": "capture +compiled", "seq_len": 3072, "samples_s": 14.0},
        {"variant": "capture +compiled", "seq_len": 40000, "samples_s": 0.6},
    ]
}
VARIANTS: dict[str, Any] = {
    "device": "test GPU",
    "torch": "test",
    "recipes": {
        "b16": {"seq_len": 3072, "anchors": 512, "block_size": 16},
        "b32": {"seq_len": 40000, "anchors": 1024, "block_size": 32},
    },
    "rows": [
        {"recipe": "b16", "variant": "trainer", "samples_s": 7.0},
        {"recipe": "b16", "variant": "flex fwd TMA", "samples_s": 6.9},
        {"recipe": "b32", "variant": "trainer", "samples_s": 1.0},
        {"recipe": "b32", "variant": "flex fwd TMA", "samples_s": 1.02},
        {"recipe": "b32", "variant": "unpadded kv", "samples_s": 0.96},
    ],
}


def test_recipe_variant_picks_that_recipes_row_only() -> None:
    per_recipe = recipe_variants(VARIANTS, ["b32=flex fwd TMA"])
    assert per_recipe == {"b32": "flex fwd TMA"}
    table, fastest = measured_rates(CAPTURE, VARIANTS, "trainer", per_recipe)
    assert table["b32"]["drafter_samples_s"] == 1.02
    assert "'flex fwd TMA' row" in table["b32"]["source"]
    assert table["b16"]["drafter_samples_s"] == 7.0  # the others keep --variant's row
    assert "'trainer' row" in table["b16"]["source"]
    assert table["b16"]["target_samples_s"] == 14.0  # the compiled capture row
    assert fastest == {"b16": 7.0, "b32": 1.02}


def test_without_overrides_every_recipe_takes_the_variant() -> None:
    table, _ = measured_rates(CAPTURE, VARIANTS, "trainer")
    assert {name: entry["drafter_samples_s"] for name, entry in table.items()} == {"b16": 7.0, "b32": 1.0}


@pytest.mark.parametrize(
    ("pair", "message"),
    [
        ("b64=trainer", "no recipe 'b64'; recipes: b16, b32"),
        ("b32=flex TMA", "has no variant 'flex TMA'; variants: 'trainer', 'flex fwd TMA', 'unpadded kv'"),
        ("b32", "expected RECIPE=VARIANT"),
        ("b32=", "expected RECIPE=VARIANT"),
    ],
)
def test_bad_recipe_variant_is_refused(pair: str, message: str) -> None:
    with pytest.raises(ValueError, match="^--recipe-variant .*" + re.escape(message)):
        recipe_variants(VARIANTS, [pair])


def results_dir(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    results.mkdir()
    (results / "target_capture.json").write_text(json.dumps(CAPTURE))
    (results / "drafter_variants.json").write_text(json.dumps(VARIANTS))
    return results


def run_main(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["role_rates.py", *args])
    return main()


def test_main_writes_the_named_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "role_rates.json"
    results = str(results_dir(tmp_path))
    code = run_main(
        monkeypatch, "--results", results, "--out", str(out), "--gpus", "8",
        "--recipe-variant", "b32=flex fwd TMA", "--recipe-variant", "b16=flex fwd TMA",
    )  # fmt: skip
    assert code == 0
    table = load_role_rates(out)
    assert table["b32"].drafter_samples_s == 1.02
    assert table["b16"].drafter_samples_s == 6.9
    assert "flex fwd TMA" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("pair", "names"), [("b64=trainer", "b16, b32"), ("b32=nope", "'trainer', 'flex fwd TMA', 'unpadded kv'")]
)
def test_main_exits_2_on_unknown_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], pair: str, names: str
) -> None:
    out = tmp_path / "role_rates.json"
    results = str(results_dir(tmp_path))
    with pytest.raises(SystemExit) as exc:
        run_main(monkeypatch, "--results", results, "--out", str(out), "--recipe-variant", pair)
    assert exc.value.code == 2
    assert names in capsys.readouterr().err
    assert not out.exists()  # nothing written


def test_main_writes_measured_colocated_rates_and_keeps_them_on_a_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "role_rates.json"
    results = str(results_dir(tmp_path))
    topology = tmp_path / "topology.json"
    topology.write_text(
        json.dumps(
            {
                "rows": [
                    {"run": "colocated-1-b16", "recipe": "b16", "topology": "colocated x1", "exit": 0,
                     "steady_samples_s": 4.5},
                    {"run": "colocated-2-b16", "recipe": "b16", "topology": "colocated x2", "exit": 0,
                     "steady_samples_s": 8.7},
                    {"run": "colocated-1-b32", "recipe": "b32", "topology": "colocated x1", "exit": 1,
                     "steady_samples_s": None},
                ]
            }
        )
    )  # fmt: skip
    assert run_main(monkeypatch, "--results", results, "--out", str(out), "--colocated", str(topology)) == 0
    table = load_role_rates(out)
    assert table["b16"].colocated_samples_s == 4.5 and "colocated-1-b16" in table["b16"].colocated_source
    assert table["b32"].colocated_samples_s is None  # its run failed: projected from the role rates
    assert run_main(monkeypatch, "--results", results, "--out", str(out)) == 0  # role rates again
    assert load_role_rates(out)["b16"].colocated_samples_s == 4.5
