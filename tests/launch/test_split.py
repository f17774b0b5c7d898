"""The split recommender: min(N x target, M x drafter), the best split, the rates table, the config hook."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_base.errors import DoctorError
from dflash_doctor.launch.split import (
    DEFAULT_RATES_PATH,
    RoleRates,
    load_role_rates,
    project_split,
    recommend_split,
    recommendation_for_config,
)
from trainer.runspec.config import load_config


def rates(target: float, drafter: float, seq_len: int = 40000) -> RoleRates:
    return RoleRates("r", seq_len, 1024, 32, target, drafter, source="test: made up")


def test_projection_is_the_slower_side() -> None:
    option = project_split(rates(0.5, 0.9), targets=5, drafters=3)
    assert option.samples_s == pytest.approx(2.5)  # 5 x 0.5 < 3 x 0.9 = 2.7
    assert option.tok_s == pytest.approx(2.5 * 40000)
    assert option.bottleneck == "target"
    assert option.idle_fraction == pytest.approx(1 - 2.5 / 2.7)


def test_best_split_follows_the_rates() -> None:
    # The story's shapes: targets are the slow role, so most GPUs capture.
    assert (
        recommend_split(rates(0.5, 0.9), 8).best.targets,
        recommend_split(rates(0.5, 0.9), 8).best.drafters,
    ) == (5, 3)
    # A cheap target (short sequences): most GPUs train.
    best = recommend_split(rates(10.0, 6.0, seq_len=3072), 8).best
    assert (best.targets, best.drafters) == (3, 5)
    assert best.tok_s == pytest.approx(min(30.0, 30.0) * 3072)


def test_every_split_is_listed_best_first() -> None:
    rec = recommend_split(rates(1.0, 1.0), 4)
    assert (rec.options[0].targets, rec.options[0].drafters) == (2, 2)
    assert sorted((o.targets, o.drafters) for o in rec.options) == [(1, 3), (2, 2), (3, 1)]
    assert rec.best.bottleneck == "balanced"
    assert all(rec.best.samples_s >= o.samples_s for o in rec.options)


def test_too_few_gpus_or_bad_rates_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 2 GPUs"):
        recommend_split(rates(1.0, 1.0), 1)
    with pytest.raises(ValueError, match="positive"):
        rates(0.0, 1.0)


def test_rates_table_round_trip_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "role_rates.json"
    assert load_role_rates(path) == {}
    entry = {"seq_len": 3072, "anchors": 512, "block_size": 16, "target_samples_s": 10.0,
             "drafter_samples_s": 6.0, "source": "measured: test"}  # fmt: skip
    path.write_text(json.dumps({"recipes": {"b16": entry}}))
    assert load_role_rates(path)["b16"].drafter_samples_s == 6.0
    path.write_text(json.dumps({"recipes": {"b16": {"seq_len": 3072}}}))
    with pytest.raises(DoctorError, match="malformed"):
        load_role_rates(path)
    path.write_text("{not json")
    with pytest.raises(DoctorError, match="cannot read"):
        load_role_rates(path)


def test_shipped_table_covers_the_shipped_gpu_recipes() -> None:
    table = load_role_rates(DEFAULT_RATES_PATH)
    assert {"qwen3-8b-b16", "seed-b32"} <= set(table)
    assert all(r.source for r in table.values())  # every number says where it came from


def test_recommendation_for_a_config_names_its_own_split() -> None:
    cfg = load_config("seed-b32", ['topology.mode="split"'])  # 1 target + 1 drafter, 40000 tokens, 1024 x 32
    table = {"seed": RoleRates("seed-b32", 40000, 1024, 32, 0.5, 0.9, source="measured: test")}
    rec = recommendation_for_config(cfg, 8, table)
    assert rec is not None
    assert (rec.best.targets, rec.best.drafters) == (5, 3)
    assert rec.current is not None and (rec.current.targets, rec.current.drafters) == (1, 1)
    text = str(rec)
    assert "5+3" in text and "this config's 1+1" in text and "measured" in text
    assert rec.to_json()["best"]["targets"] == 5
    assert recommendation_for_config(load_config("seed-b32"), 8, table).current is None  # auto: no own split


def test_no_recommendation_without_rates_at_these_shapes_or_gpus() -> None:
    table = {"other": RoleRates("other", 3072, 512, 16, 10.0, 6.0)}
    assert recommendation_for_config(load_config("seed-b32"), 8, table) is None
    assert recommendation_for_config(load_config("qwen3-8b-b16"), 1, table) is None
