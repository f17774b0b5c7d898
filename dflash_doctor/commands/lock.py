"""`dflash-doctor lock`: record the known-good environment to a JSON lock file (atomically)."""

from __future__ import annotations

from pathlib import Path

import typer

from dflash_base.errors import DoctorError
from dflash_doctor.commands.options import FLAG, JsonOption, PythonOption
from dflash_doctor.context import CheckContext, CheckOptions
from dflash_doctor.env.environment import Environment
from dflash_doctor.lock.lockfile import DEFAULT_LOCK_NAME, capture_lock, write_lock
from dflash_doctor.report import dumps

LOCK_WRITTEN_SCHEMA = "dflash-doctor/lock-written/v1"
OutOption = typer.Option(Path(DEFAULT_LOCK_NAME), "--out", "-o", help="Where to write the lock.")


def lock_command(
    out: Path = OutOption,
    python: str | None = PythonOption,
    json_out: bool = JsonOption,
    deep: bool = typer.Option(
        False,
        "--deep",
        metavar=FLAG,
        help="Also run the deep probe and record CUDA context overhead and loaded versions.",
    ),
) -> None:
    """Record this environment (packages, torch build, library hashes, driver, GPUs, env vars) as known-good."""
    ctx = CheckContext(Environment.load(python), CheckOptions(deep=deep))
    runtime = None
    if deep:
        from dflash_doctor.deep.run import deep_report

        runtime = deep_report(ctx).lock_runtime()
    lock = capture_lock(ctx, runtime)
    ctx.env.save_parse_cache()
    try:
        written = write_lock(lock, out)
    except OSError as exc:
        raise DoctorError(
            f"lock --out {out}: {exc.strerror}", hint="write it where you may write files: --out PATH"
        ) from exc
    if json_out:
        typer.echo(dumps({"schema": LOCK_WRITTEN_SCHEMA, "written": str(written), "lock": lock.to_json()}))
        return
    torch = lock.torch or {}
    libs = "not modelled" if lock.libraries is None else f"{len(lock.libraries)} libraries hashed"
    typer.echo(
        f"wrote {written}: {len(lock.distributions)} distributions, torch {torch.get('version', 'absent')} "
        f"(git {str(torch.get('git_version') or 'unknown')[:12]}), {libs}, {len(lock.gpus)} GPU(s)"
    )


def register(app: typer.Typer) -> None:
    app.command("lock")(lock_command)
