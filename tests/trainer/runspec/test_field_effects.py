"""Each config field declares what changing it changes (the compiled graph, one step's time, or only
bookkeeping), and the doctor's rules are derived from those declarations (issue 55 section 3): what keys a
warm-up's record, which `--set`s keep a measured step time."""

from __future__ import annotations

from dataclasses import fields

import pytest

from dflash_doctor.launch.compile_cache import graph_fields
from dflash_doctor.launch.time_plan import neutral, step_sets
from trainer.runspec.config import SCHEMA
from trainer.runspec.field_effects import FIELD_EFFECTS, effect_of, graph_part, keeps_step_time
from trainer.runspec.fields import BOOKKEEPING, EFFECTS, GRAPH, STEP_TIME, integer, option


def test_every_config_field_declares_an_effect() -> None:
    missing = [
        f"{section}.{f.name}"
        for section, (cls, rules) in SCHEMA.items()
        for f in fields(cls)
        if f.name in rules and f.metadata.get("effect") not in EFFECTS
    ]
    assert not missing, f"config fields without an effect (option(..., effect=...)): {missing}"
    assert set(FIELD_EFFECTS) == {f"{s}.{k}" for s, (_, rules) in SCHEMA.items() for k in rules}


def test_a_field_cannot_be_declared_without_an_effect() -> None:
    with pytest.raises(TypeError):
        option(1, integer(1))  # type: ignore[call-arg]  # the missing effect is the point
    with pytest.raises(ValueError, match="effect 'shapes'"):
        option(1, integer(1), effect="shapes")


# The rules the doctor kept as lists before the fields said it themselves (launch/time_plan.py's step-neutral
# prefixes; launch/compile_cache.py's and cache/warm_record.py's graph filters): the same fields, but
# `run.seed`, which changes values, never shapes, and no longer keys the warm-up's record.
BOOKKEEPING_FIELDS = {
    "optim.steps", "optim.epochs", "optim.lr", "optim.warmup_ratio", "optim.min_lr_ratio", "optim.schedule",
    "eval.every", "eval.prompts", "eval.min_tau", "eval.max_new_tokens", "checkpoint.every", "checkpoint.keep",
    "output.dir", "output.export_dtype",
    "output.tensorboard", "output.wandb", "run.log_every", "run.timeout_s", "run.seed", "profile.start",
    "profile.steps",
}  # fmt: skip
STEP_TIME_FIELDS = {
    "optim.grad_clip", "optim.grad_accum", "optim.weight_decay", "optim.betas", "topology.overlap_capture",
    "data.workers", "topology.placement",
}  # fmt: skip


def test_the_effects_are_the_ones_the_doctor_acted_on() -> None:
    assert {k for k, e in FIELD_EFFECTS.items() if e == BOOKKEEPING} == BOOKKEEPING_FIELDS
    assert {k for k, e in FIELD_EFFECTS.items() if e == STEP_TIME} == STEP_TIME_FIELDS
    assert effect_of("optim.anchors") == GRAPH and effect_of("drafter.block_size") == GRAPH
    assert effect_of("drafter.flex_tma") is None  # a key the config does not have


def test_the_time_plan_keeps_a_measured_step_over_bookkeeping_sets_only() -> None:
    for key, effect in FIELD_EFFECTS.items():
        assert neutral(f"{key}=1") == (effect == BOOKKEEPING) == keeps_step_time(f" {key} =1"), key
    command = ["--set", "optim.lr=1e-3", "--set", "optim.grad_accum=2", "--set", "data.seq_len=64"]
    assert step_sets(command) == ["optim.grad_accum=2", "data.seq_len=64"]


def test_the_warm_up_key_keeps_the_graph_fields_only() -> None:
    raw = {
        "drafter": {"layers": 2, "compile_mode": "default"},
        "optim": {"lr": 1e-3, "anchors": 64, "grad_accum": 4, "steps": 9},
        "data": {"seq_len": 256, "workers": 2},
        "eval": {"every": 5},
        "output": {"dir": "runs/x"},
        "run": {"seed": 3, "device": "cpu"},
        "worker threads": "1",  # not a section: kept as it is
    }
    expected = {
        "drafter": {"layers": 2, "compile_mode": "default"},
        "optim": {"anchors": 64},
        "data": {"seq_len": 256},
        "run": {"device": "cpu"},
        "worker threads": "1",
    }
    assert graph_part(raw) == expected and graph_fields(raw) == expected
