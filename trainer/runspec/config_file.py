"""Config files as text: find one (a path, or the name of a shipped config), read it, apply `--set`
overrides, and write it back as TOML (the launcher and the benches hand workers a file with the overrides
applied). Validation is `trainer.runspec.config`'s job."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import tomllib

from dflash_base.errors import ConfigError
from trainer.runspec.fields import _shown

SHIPPED_CONFIGS = Path(__file__).resolve().parents[1] / "configs"  # trainer/configs


def resolve_config_path(name_or_path: str | Path) -> Path:
    """A path to a TOML file, or the name of a shipped config (`tiny-cpu` or `tiny-cpu.toml`).

    Only a bare name falls back to the shipped configs: `some/dir/tiny-cpu.toml` that does not exist is
    an error, never silently the shipped `tiny-cpu` (issue 18, row 3).
    """
    path = Path(name_or_path)
    if path.is_file():
        return path
    names = ", ".join(sorted(p.stem for p in SHIPPED_CONFIGS.glob("*.toml")))
    if path.exists():
        raise ConfigError(f"config: {str(name_or_path)!r} is not a file", hint="give a TOML file")
    if len(path.parts) != 1:
        raise ConfigError(
            f"config: no such file {str(name_or_path)!r}",
            hint=f"check the path; a shipped config is named without a folder ({names})",
        )
    shipped = SHIPPED_CONFIGS / f"{path.name.removesuffix('.toml')}.toml"
    if shipped.is_file():
        return shipped
    raise ConfigError(
        f"config: no file {str(name_or_path)!r} and no shipped config of that name (shipped: {names})"
    )


# Keys that are one choice between two: setting one with --set drops the other from the file, so a recipe that
# trains for epochs runs for `--set optim.steps=N` instead of failing "set exactly one".
ONE_OF = {("optim", "steps"): ("optim", "epochs"), ("optim", "epochs"): ("optim", "steps")}


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`section.key=value` strings (value in TOML syntax, bare words taken as strings) on top of the file."""
    overridden = {tuple(item.partition("=")[0].strip().partition(".")[::2]) for item in overrides}
    for item in overrides:
        dotted, sep, value_text = item.partition("=")
        section, dot, key = dotted.strip().partition(".")
        if not sep or not dot or not section or not key:
            raise ConfigError(f"--set {item}: must look like section.key=value")
        try:
            value = tomllib.loads(f"v = {value_text.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = value_text.strip()
        body = raw.setdefault(section, {})
        if not isinstance(body, dict):
            raise ConfigError(f"{section}: must be a table ([{section}]), got {_shown(body)}")
        body[key] = value
        other = ONE_OF.get((section, key))
        if other is not None and other not in overridden:  # both set with --set: the config check says so
            raw.get(other[0], {}).pop(other[1], None)
    return raw


def replaced_by_overrides(raw: dict[str, Any], overrides: list[str]) -> list[str]:
    """A line for each key of the file that a `--set` of its one-of partner drops (`apply_overrides`): `--set
    optim.epochs=3` trains for epochs, not the config's `optim.steps = 300`, and says so (issue 58, U14b: it
    was dropped silently)."""
    overridden = {tuple(item.partition("=")[0].strip().partition(".")[::2]) for item in overrides}
    lines = []
    for (section, key), (other_section, other_key) in ONE_OF.items():
        body = raw.get(other_section)
        dropped = (
            isinstance(body, dict) and other_key in body and (other_section, other_key) not in overridden
        )
        if (section, key) in overridden and dropped:
            assert isinstance(body, dict)
            lines.append(
                f"--set {section}.{key} replaces the config's {other_section}.{other_key} = "
                f"{_toml_value(body[other_key])} (a run takes one of the two)"
            )
    return lines


def config_to_toml(raw: dict[str, Any]) -> str:
    """A raw config (sections of scalars, lists and inline tables) as TOML text that `read_raw` reads back.
    The launcher and the benches write configs with overrides applied; tomllib only reads TOML."""
    lines = []
    for section, body in raw.items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in body.items())
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    """JSON's scalars and lists are valid TOML; a table (drafter.flex_kernel_options) needs `key = value`."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)


def read_raw(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_bytes().decode("utf-8-sig"))  # a BOM (Windows editors) is fine
    except OSError as exc:
        raise ConfigError(f"config: cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config: {path} is not UTF-8 text (byte {exc.start}: {exc.reason})",
            hint="TOML files are UTF-8; save it as UTF-8",
        ) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config: {path} is not valid TOML: {exc}") from exc
    except ValueError as exc:  # Python's limit on an integer's digits (issue 58, N4: a traceback, exit 3)
        raise ConfigError(
            f"config: {path}{_long_number_line(path)}: an integer of more digits than Python reads ({exc})",
            hint="no setting takes a number that long; fix that value",
        ) from None


def _long_number_line(path: Path) -> str:
    """` line N` of the first line holding a run of digits too long to read, or nothing."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except (OSError, UnicodeDecodeError):
        return ""
    limit = sys.get_int_max_str_digits() or 4300
    for number, line in enumerate(text.splitlines(), start=1):
        if re.search(rf"[0-9_]{{{limit + 1},}}", line):
            return f" line {number}"
    return ""
