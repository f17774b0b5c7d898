"""`dflash-doctor check`: audit the environment and give verdicts."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from dflash_base.errors import DoctorError
from dflash_doctor.commands.options import (
    FLAG,
    JsonOption,
    LockOption,
    OnlyOption,
    PythonOption,
    StrictOption,
    default_lock,
    split_only,
)
from dflash_doctor.console import make_console
from dflash_doctor.context import CheckContext, CheckOptions
from dflash_doctor.env.environment import Environment
from dflash_doctor.env.interpreter import InterpreterProbe
from dflash_doctor.registry import all_checks, run_checks, unknown_selectors
from dflash_doctor.report import dumps, exit_code, flatten, render, to_json


def audit(
    python: str | None,
    only: list[str],
    options: CheckOptions,
) -> tuple[CheckContext, list]:
    """Load the environment and run the selected checks (shared by `check` and the launch gate)."""
    # The audited interpreter starts answering its probe while the check modules are imported.
    probe = InterpreterProbe(python) if python is not None else None
    try:
        selectors = split_only(only)
        unknown = unknown_selectors(selectors)
        if unknown:
            ids = ", ".join(sorted({c.area for c in all_checks()}))
            raise DoctorError(f"--only: no check matches {', '.join(unknown)}", hint=f"areas are: {ids}")
        began = time.perf_counter()
        env = Environment.load(python, probe=probe)
        env.prefetch_records()  # a first run: every RECORD parsed in a few processes, not one after another
    except BaseException:
        if probe is not None:
            probe.cancel()
        raise
    ctx = CheckContext(env, options)
    ctx.phase_seconds["environment"] = time.perf_counter() - began
    runs = run_checks(ctx, selectors)
    began = time.perf_counter()
    ctx.env.save_parse_cache()
    ctx.phase_seconds["save"] = time.perf_counter() - began
    return ctx, runs


def check_command(
    python: str | None = PythonOption,
    only: list[str] = OnlyOption,
    json_out: bool = JsonOption,
    strict: bool = StrictOption,
    deep: bool = typer.Option(
        False, "--deep", metavar=FLAG, help="Also import torch in a child process, init CUDA, test flex."
    ),
    lock: Path | None = LockOption,
    no_lock: bool = typer.Option(False, "--no-lock", metavar=FLAG, help="Ignore ./dflash.lock."),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", metavar=FLAG, help="Show evidence for passing findings too."
    ),
) -> None:
    """Audit the environment: torch build, CUDA packages, shared libraries, GPUs, compile cache."""
    lock_path = default_lock(lock, no_lock)
    if lock_path is not None and not lock_path.is_file():
        what = "a folder, not a lock file" if lock_path.is_dir() else "no such file"
        raise DoctorError(f"--lock {lock_path}: {what}", hint="create one with `dflash-doctor lock`")
    if lock_path is not None:
        from dflash_doctor.lock.lockfile import read_lock  # only when a lock is compared

        read_lock(lock_path)  # a lock that cannot be read is bad input (exit 2), as in `diff`
    start = time.perf_counter()
    ctx, runs = audit(python, only, CheckOptions(deep=deep, lock_path=lock_path, strict=strict))
    elapsed = time.perf_counter() - start
    interp = ctx.env.interpreter
    context = {
        "python": interp.executable,
        "python_version": interp.version,
        "seconds": round(elapsed, 3),
        # this process's own CPU time since it started (its forked helpers' not counted): on a machine with
        # CPUs to spare for the helpers, what its wall time cannot go below
        "cpu_seconds": round(time.process_time(), 3),
        # the work started beside the checks, as this process paid for it (the checks' own figures leave it out)
        "start_seconds": {name: round(s, 4) for name, s in ctx.start_seconds.items()},
        # reading the environment (the parse cache, every dist-info) before any check; writing the cache after
        "phase_seconds": {name: round(s, 4) for name, s in ctx.phase_seconds.items()},
    }
    if json_out:
        typer.echo(dumps(to_json(runs, context, strict)))
    else:
        console = make_console()  # rich is not imported for --json
        render(runs, console, verbose, header=f"dflash-doctor check · {interp.executable} · {elapsed:.2f} s")
    raise typer.Exit(exit_code(flatten(runs), strict))


def register(app: typer.Typer) -> None:
    app.command("check")(check_command)
