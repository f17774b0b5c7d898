"""Options shared by every command that audits an environment, so they read the same everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

PythonOption = typer.Option(
    None,
    "--python",
    help="Audit another interpreter's environment (e.g. .venv/bin/python); default: this one.",
)
# metavar "": a flag takes no value, and typer would otherwise print `--json <bool>` in --help (the CLI now
# shows no type for any flag: dflash_doctor/cli.py, `_flags_show_no_type`).
FLAG = ""
JsonOption = typer.Option(
    False, "--json", metavar=FLAG, help="Print machine-readable JSON (versioned schema)."
)
OnlyOption = typer.Option(
    [], "--only", help="Run only these checks or areas (repeatable, comma-separated): --only libs,torch."
)
StrictOption = typer.Option(False, "--strict", metavar=FLAG, help="Exit 1 on warnings too.")
LockOption = typer.Option(
    None, "--lock", help="Compare against this lock file (default: ./dflash.lock when it exists)."
)


# `--config` and `--set`: one declaration each, for every command that reads a training config (train, eval,
# data regenerate, data preview). Annotated types, so a command says `config: ConfigOption` and the option reads
# the same everywhere; typer copies the option object per parameter.
_CONFIG = typer.Option("--config", help="A training config (TOML) or a shipped config's name.")
ConfigOption = Annotated[str, _CONFIG]
OptionalConfigOption = Annotated[str | None, _CONFIG]


def one_value_per_key(values: list[str] | None) -> list[str] | None:
    """`--set optim.steps=50 --set optim.steps=80`: the last one wins, as before, but said (one warning line on
    stderr naming both values), never silently. Kept, not refused: scripts set defaults, then override them."""
    seen: dict[str, str] = {}
    for item in values or []:
        key, _, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if key in seen and seen[key] != value:
            typer.echo(
                f"warning: --set {key} given twice ({seen[key]!r}, then {value!r}): {value!r} is used",
                err=True,
            )
        seen[key] = value
    return values


# None when no --set is given (a list default would be one shared mutable object): read it as `overrides or []`.
SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        callback=one_value_per_key,
        help="Override a config field (repeatable): --set data.seq_len=256.",
    ),
]


def split_only(values: list[str]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def default_lock(lock: Path | None, no_lock: bool) -> Path | None:
    if no_lock:
        return None
    if lock is not None:
        return lock
    candidate = Path.cwd() / "dflash.lock"
    return candidate if candidate.is_file() else None
