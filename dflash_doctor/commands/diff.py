"""`dflash-doctor diff [A [B]]`: what changed between a lock and this environment, or between two locks.

Exit code: 1 when a change is fail-level (another build behind the same version, changed library
bytes), else 0, so scripts can gate on it like on `check`.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from dflash_base.errors import DoctorError
from dflash_doctor.commands.options import JsonOption, PythonOption
from dflash_doctor.console import make_console
from dflash_doctor.context import CheckContext
from dflash_doctor.env.environment import Environment
from dflash_doctor.findings import Severity
from dflash_doctor.lock.drift import Change, diff_locks, worst_severity
from dflash_doctor.lock.lockfile import DEFAULT_LOCK_NAME, EnvironmentLock, capture_lock, read_lock
from dflash_doctor.report import ICONS, dumps

DIFF_SCHEMA = "dflash-doctor/diff/v1"
BeforeArgument = typer.Argument(None, help="The lock to compare from (default: ./dflash.lock).")
AfterArgument = typer.Argument(None, help="A second lock (default: the current environment).")


def _current(python: str | None) -> EnvironmentLock:
    return capture_lock(CheckContext(Environment.load(python)))


def diff_command(
    before: Path | None = BeforeArgument,
    after: Path | None = AfterArgument,
    python: str | None = PythonOption,
    json_out: bool = JsonOption,
) -> None:
    """Show what changed since the lock: packages, torch build, library hashes, driver, GPUs, env vars."""
    if before is None:
        before = Path.cwd() / DEFAULT_LOCK_NAME
        if not before.is_file():
            raise DoctorError(
                "no lock given and no ./dflash.lock here", hint="create one with `dflash-doctor lock`"
            )
    if after is not None and python is not None:
        raise DoctorError("--python only applies when comparing a lock with an environment, not two locks")
    old = read_lock(before)
    new = read_lock(after) if after is not None else _current(python)
    changes = diff_locks(old, new)
    after_label = str(after) if after is not None else "current environment"
    code = 1 if worst_severity(changes) is Severity.FAIL else 0
    if json_out:
        typer.echo(
            dumps(
                {
                    "schema": DIFF_SCHEMA,
                    "before": str(before),
                    "after": after_label,
                    "libraries_compared": old.libraries is not None and new.libraries is not None,
                    "changes": [c.to_json() for c in changes],
                    "exit_code": code,
                }
            )
        )
    else:
        render_changes(changes, str(before), after_label, make_console())
        if old.libraries is None or new.libraries is None:
            why = old.libraries_note or new.libraries_note or "a lock without library hashes"
            typer.echo(f"library hashes not compared: {why}")
    raise typer.Exit(code)


def render_changes(changes: list[Change], before: str, after: str, console: Console) -> None:
    """One block per change, values on their own lines so commits and hashes never wrap mid-value."""
    console.print(escape(f"dflash-doctor diff · {before} -> {after}"))
    if not changes:
        console.print(Text("• No changes.", style="bold green"))
        return
    for change in changes:
        icon, style = ICONS[change.severity]
        line = Text(f"[{icon}] ", style=f"bold {style}")
        line.append(change.kind, style=style)
        line.append(f"  {change.subject}", style="bold")
        if change.note:
            line.append(f"  ({change.note})", style="dim")
        console.print(line, soft_wrap=True)
        console.print(Text(f"      locked: {_cell(change.before)}", style="dim"), soft_wrap=True)
        console.print(Text(f"      now:    {_cell(change.after)}"), soft_wrap=True)
    fails = sum(c.severity is Severity.FAIL for c in changes)
    console.print(
        Text(f"{len(changes)} change(s), {fails} failing.", style="bold red" if fails else "bold yellow")
    )


def _cell(value: object) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "(none)"
    return str(value)


def register(app: typer.Typer) -> None:
    app.command("diff")(diff_command)
