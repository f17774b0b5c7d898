"""Config field rules: each parser takes (dotted name, raw TOML value) and returns the checked value or raises
a ConfigError that names the field and what it must be (`drafter.block_size: must be an integer >= 2, got
"sixteen"`). `option(default, parser, effect=...)` declares a config field, its rule and what changing it
changes, in one place (trainer.runspec.config).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import Field, field
from typing import Any

from dflash_base.errors import ConfigError

Parser = Callable[[str, Any], Any]


def _shown(value: Any) -> str:
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


def _fail(name: str, expected: str, value: Any) -> ConfigError:
    return ConfigError(f"{name}: must be {expected}, got {_shown(value)}")


def integer(minimum: int | None = None, maximum: int | None = None) -> Parser:
    expected = "an integer" + (f" >= {minimum}" if minimum is not None else "")
    expected += f" <= {maximum}" if maximum is not None else ""

    def parse(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(name, expected, value)
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise _fail(name, expected, value)
        return value

    return parse


def integer_or_auto(minimum: int, maximum: int) -> Parser:
    """`"auto"` (resolved where the machine is known) or an integer from `minimum` to `maximum`."""
    expected = f'"auto" or an integer >= {minimum} <= {maximum}'

    def parse(name: str, value: Any) -> int | str:
        if value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            raise _fail(name, expected, value)
        return value

    return parse


def number(minimum: float | None = None, maximum: float | None = None, above: float | None = None) -> Parser:
    parts = ["a number"]
    if above is not None:
        parts.append(f"> {above}")
    if minimum is not None:
        parts.append(f">= {minimum}")
    if maximum is not None:
        parts.append(f"<= {maximum}")
    expected = " ".join(parts)

    def parse(name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise _fail(name, expected, value)
        too_low = (minimum is not None and value < minimum) or (above is not None and value <= above)
        if too_low or (maximum is not None and value > maximum):
            raise _fail(name, expected, value)
        return float(value)

    return parse


def choice(*options: str) -> Parser:
    expected = "one of " + ", ".join(f'"{o}"' for o in options)

    def parse(name: str, value: Any) -> str:
        if value not in options:
            raise _fail(name, expected, value)
        return value

    return parse


def boolean() -> Parser:
    def parse(name: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise _fail(name, "true or false", value)
        return value

    return parse


def text() -> Parser:
    def parse(name: str, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise _fail(name, "a non-empty string", value)
        return value

    return parse


def int_list(minimum: int = 0) -> Parser:
    expected = f"a non-empty list of distinct integers >= {minimum}"

    def parse(name: str, value: Any) -> list[int]:
        if not isinstance(value, list) or not value:
            raise _fail(name, expected, value)
        if any(isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in value):
            raise _fail(name, expected, value)
        if len(set(value)) != len(value):  # only now: a list of lists is unhashable
            raise _fail(name, expected, value)
        return list(value)

    return parse


def betas() -> Parser:
    expected = "two numbers in [0, 1), like [0.9, 0.95]"

    def parse(name: str, value: Any) -> tuple[float, float]:
        if not isinstance(value, list) or len(value) != 2:
            raise _fail(name, expected, value)
        if any(isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1 for v in value):
            raise _fail(name, expected, value)
        return (float(value[0]), float(value[1]))

    return parse


def power_of_two(minimum: int, maximum: int) -> Parser:
    expected = f"a power of two from {minimum} to {maximum}"

    def parse(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(name, expected, value)
        if not minimum <= value <= maximum or value & (value - 1):
            raise _fail(name, expected, value)
        return value

    return parse


def int_choice(*options: int) -> Parser:
    expected = "one of " + ", ".join(str(o) for o in options)

    def parse(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value not in options:
            raise _fail(name, expected, value)
        return value

    return parse


def table() -> Parser:
    """A TOML table of plain values (strings, numbers, booleans, lists), e.g. {enable_thinking = false}."""
    expected = "a table of plain values, like {enable_thinking = false}"

    def parse(name: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict) or any(isinstance(v, dict) for v in value.values()):
            raise _fail(name, expected, value)
        return dict(value)

    return parse


# flex_attention's kernel_options that a config may set (torch.nn.attention.flex_attention.FlexKernelOptions).
# A `fwd_`/`bwd_` prefix applies an option to the forward/backward kernel only (torch strips the prefix
# there); the backward kernel has two block pairs (M1/N1: the dK/dV loop, M2/N2: the dQ loop).
_FLAG = boolean()


_BLOCK = power_of_two(16, 128)


_WARPS = int_choice(1, 2, 4, 8, 16)


_STAGES = integer(1, 8)


FLEX_KERNEL_OPTIONS: dict[str, Parser] = {
    "USE_TMA": _FLAG,
    "PRESCALE_QK": _FLAG,
    "BLOCKS_ARE_CONTIGUOUS": _FLAG,
    "BLOCK_M": _BLOCK,
    "BLOCK_N": _BLOCK,
    "num_warps": _WARPS,
    "num_stages": _STAGES,
    "fwd_USE_TMA": _FLAG,
    "fwd_BLOCK_M": _BLOCK,
    "fwd_BLOCK_N": _BLOCK,
    "fwd_num_warps": _WARPS,
    "fwd_num_stages": _STAGES,
    "bwd_USE_TMA": _FLAG,
    "bwd_BLOCK_M1": _BLOCK,
    "bwd_BLOCK_N1": _BLOCK,
    "bwd_BLOCK_M2": _BLOCK,
    "bwd_BLOCK_N2": _BLOCK,
    "bwd_num_warps": _WARPS,
    "bwd_num_stages": _STAGES,
}


# Real kernel options refused on purpose, with the reason.
REFUSED_KERNEL_OPTIONS = {
    "ROWS_GUARANTEED_SAFE": (
        "it made flex return NaN with the DFlash block mask on an H200 (bench/kernels/flex_sweep.py, seed-b32, row "
        "'rows safe'), for a 0.3% gain; remove it"
    ),
}


def kernel_options() -> Parser:
    """A table of flex_attention kernel options: known keys only, each value checked by its own rule."""
    parsers = FLEX_KERNEL_OPTIONS
    expected = "a table of flex_attention kernel options, like {USE_TMA = true, BLOCK_M = 64}"

    def parse(name: str, value: Any) -> dict[str, int | bool]:
        if not isinstance(value, dict):
            raise _fail(name, expected, value)
        refused = [key for key in value if key in REFUSED_KERNEL_OPTIONS]
        if refused:
            raise ConfigError(f"{name}.{refused[0]}: refused: {REFUSED_KERNEL_OPTIONS[refused[0]]}")
        unknown = [key for key in value if key not in parsers]
        if unknown:
            raise ConfigError(
                f"{name}: must be {expected}, got {_shown(value)}: unknown option {_shown(unknown[0])} "
                f"(known: {', '.join(parsers)}); remove it or correct its spelling"
            )
        return {key: parsers[key](f"{name}.{key}", v) for key, v in value.items()}

    return parse


# What changing a field changes, strongest first. The doctor derives from these what keys a warm-up's record
# (only GRAPH fields: trainer.runspec.field_effects.graph_part) and which `--set`s keep a measured step time
# (only BOOKKEEPING ones: field_effects.keeps_step_time).
GRAPH = "graph"  # may reach a compiled graph: a shape, a dtype, what is compiled, what is captured or how
STEP_TIME = "step time"  # the same graphs, but one optimizer step takes another time (accumulation, workers)
BOOKKEEPING = "bookkeeping"  # neither: how long the run goes, where it writes, the schedule, the seed
EFFECTS = (GRAPH, STEP_TIME, BOOKKEEPING)


def option(
    default: Any = None,
    parse: Parser | None = None,
    factory: Callable[[], Any] | None = None,
    *,
    effect: str,
) -> Any:
    """A config field: its default (or `factory` for a mutable one), the rule a TOML value must pass and its
    effect (GRAPH, STEP_TIME or BOOKKEEPING). A field without a rule is not a TOML key (filled in by
    `load_config`)."""
    if effect not in EFFECTS:
        raise ValueError(f"effect {effect!r}: must be one of {EFFECTS}")
    metadata: dict[str, Any] = {"effect": effect}
    if parse is not None:
        metadata["parse"] = parse
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def rules_of(fields_: tuple[Field[Any], ...]) -> dict[str, Parser]:
    """The TOML keys of a section and their rules, in declaration order."""
    return {f.name: f.metadata["parse"] for f in fields_ if "parse" in f.metadata}
