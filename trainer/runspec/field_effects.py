"""What changing a config field changes, read from the fields themselves (`option(..., effect=...)` in
trainer.runspec.config): the doctor's rules for what keys a warm-up's record (GRAPH fields only) and which
`--set`s keep a measured step time (BOOKKEEPING ones) are derived here, not listed beside it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from trainer.runspec.config import SCHEMA
from trainer.runspec.fields import BOOKKEEPING, GRAPH

# "section.key" -> its effect, for every TOML key of the config (a field without a rule is not a key)
FIELD_EFFECTS: dict[str, str] = {
    f"{section}.{f.name}": f.metadata["effect"]
    for section, (cls, rules) in SCHEMA.items()
    for f in fields(cls)
    if f.name in rules
}


def effect_of(key: str) -> str | None:
    """The effect of a dotted key (`optim.lr` -> BOOKKEEPING); None for a key the config does not have."""
    return FIELD_EFFECTS.get(key.strip())


def keeps_step_time(set_item: str) -> bool:
    """A `--set key=value` that changes how long a run goes on or where it writes, not one step's time: a run
    that differs from another only in these still measured the other's step."""
    return effect_of(set_item.split("=", 1)[0]) == BOOKKEEPING


# Sections without a GRAPH field (`eval`, `checkpoint`, `output`, `profile`): left out of graph_part whole
_NO_GRAPH_SECTIONS = frozenset(
    section
    for section, (_, rules) in SCHEMA.items()
    if all(FIELD_EFFECTS[f"{section}.{k}"] != GRAPH for k in rules)
)


def graph_part(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A raw config (its TOML tables) with only its GRAPH fields, so that a launch that changes only the
    schedule, the step's cost or the bookkeeping (`optim.lr`, `eval.every`, `data.workers`) finds the warm-up
    record of the last one (issue 39 U4). An entry that is not a section of the config is kept as it is."""
    kept: dict[str, Any] = {}
    for section, body in raw.items():
        if section in _NO_GRAPH_SECTIONS:
            continue
        if section in SCHEMA and isinstance(body, Mapping):
            body = {k: v for k, v in body.items() if FIELD_EFFECTS.get(f"{section}.{k}", GRAPH) == GRAPH}
        kept[section] = body
    return kept
