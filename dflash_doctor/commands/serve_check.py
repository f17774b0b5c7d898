"""`dflash-doctor serve-check --export DIR --engine vllm|sglang`: will this engine load the export as we wrote it?"""

from __future__ import annotations

import time

import typer

from dflash_doctor.commands.options import FLAG, JsonOption
from dflash_doctor.registry import Check, CheckRun
from dflash_doctor.report import dumps, exit_code, render, to_json
from dflash_doctor.serving.check import DEFAULT_TIMEOUT_S, ENGINES, run_serve_check


def serve_check_command(
    export: str = typer.Option(..., "--export", help="The drafter's export folder (what the trainer wrote)."),
    engine: str = typer.Option(..., "--engine", help=" | ".join(ENGINES)),
    python: str | None = typer.Option(
        None, "--python", help="The python that has the engine (default: the one of its command on PATH)."
    ),
    timeout: float = typer.Option(DEFAULT_TIMEOUT_S, "--timeout", min=1, help="Seconds the engine may take."),
    json_out: bool = JsonOption,
    verbose: bool = typer.Option(
        False, "--verbose", "-v", metavar=FLAG, help="Show evidence for passing findings too."
    ),
) -> None:
    """Load the export with the real vLLM or SGLang (on CPU, in its own python) and compare every weight."""
    start = time.perf_counter()
    result = run_serve_check(engine, export, python, timeout)
    elapsed = time.perf_counter() - start
    title = f"{result.engine.title} loads the export (verified with {result.engine.verified})"
    runs = [CheckRun(Check(f"serve.{result.engine.key}", title, lambda _ctx: []), result.findings, elapsed)]
    context = {
        "engine": result.engine.key,
        "engine_version": result.verdict.get("engine_version"),
        "verified_against": result.engine.verified,
        "python": result.python,
        "export": str(result.export),
        "seconds": round(elapsed, 3),
    }
    if json_out:
        typer.echo(dumps({**to_json(runs, context), "verdict": result.verdict}))
    else:
        from dflash_doctor.console import make_console

        header = f"dflash-doctor serve-check · {result.engine.title} · {result.python} · {elapsed:.1f} s"
        render(runs, make_console(), verbose, header=header)
    raise typer.Exit(exit_code(result.findings))


def register(app: typer.Typer) -> None:
    app.command("serve-check")(serve_check_command)
