"""`dflash-doctor runs` and `runs show ID`: past launches and refusals, and what changed since a good one."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from dflash_doctor.commands.options import JsonOption
from dflash_doctor.launch.runs import RunRecord, RunStore, describe_age

runs_app = typer.Typer(help="Past launches: config, environment, verdicts, throughput, outcome.")

STATUS_STYLE = {
    "succeeded": "green",
    "failed": "red",
    "refused": "yellow",
    "interrupted": "yellow",
    "running": "cyan",
}


def _fmt_tps(record: RunRecord) -> str:
    tps = record.tokens_per_second
    return "-" if tps is None else f"{tps:,.0f}"


@runs_app.callback(invoke_without_command=True)
def list_runs(
    ctx: typer.Context, json_out: bool = JsonOption, limit: int = typer.Option(20, "--limit")
) -> None:
    """List recent runs, newest first."""
    if ctx.invoked_subcommand is not None:
        return
    records = RunStore().all()[::-1][:limit]
    if json_out:
        typer.echo(json.dumps([r.to_json() for r in records], indent=2, default=str))
        return
    console = Console(highlight=False)
    if not records:
        console.print("No runs yet. Launch one with `dflash-doctor train --config run.toml`.")
        return
    table = Table(title="dflash-doctor runs")
    for column in ("id", "when", "status", "config", "tok/s", "exit", "overrides"):
        table.add_column(column)
    for r in records:
        style = STATUS_STYLE.get(r.status, "")
        table.add_row(
            r.id,
            describe_age(r),
            f"[{style}]{r.status}[/]",
            r.config_path or "-",
            _fmt_tps(r),
            "-" if r.exit_code is None else str(r.exit_code),
            ", ".join(r.overrides) or "-",
        )
    console.print(table)


def environment_changes(record: RunRecord, baseline: RunRecord) -> list[dict[str, Any]]:
    """What changed in the environment between a good run and this one (uses the lock differ)."""
    from dflash_doctor.lock.drift import diff_locks
    from dflash_doctor.lock.lockfile import EnvironmentLock

    if not baseline.environment or not record.environment:
        return []
    before, after = (
        EnvironmentLock.from_json(baseline.environment),
        EnvironmentLock.from_json(record.environment),
    )
    return [c.to_json() for c in diff_locks(before, after)]


@runs_app.command("show")
def show_run(
    run_id: str = typer.Argument(..., help="A run id (a unique prefix is enough)."),
    json_out: bool = JsonOption,
) -> None:
    """Show one run; for a failed, refused or slow run, the environment diff against the last good one."""
    store = RunStore()
    record = store.load(run_id)
    baseline = store.last_successful(before=record)
    changes = environment_changes(record, baseline) if baseline is not None else []
    if json_out:
        typer.echo(
            json.dumps(
                {"run": record.to_json(), "baseline": baseline.id if baseline else None, "changes": changes},
                indent=2,
                default=str,
            )
        )
        return
    console = Console(highlight=False)
    when = dt.datetime.fromtimestamp(record.created).isoformat(timespec="seconds")
    style = STATUS_STYLE.get(record.status, "")
    console.print(
        f"[bold]run {record.id}[/] · {when} · [{style}]{record.status}[/] · exit {record.exit_code}"
    )
    console.print(f"config: {record.config_path}")
    if record.command:
        console.print(f"command: {' '.join(record.command)}")
    if record.overrides:
        console.print(f"[yellow]launched over failing findings (--force): {', '.join(record.overrides)}[/]")
    failing = [f for f in record.findings if f.get("severity") in ("fail", "warn")]
    for finding in failing:
        console.print(f"  {finding['severity']}: {finding['id']}: {finding['summary']}")
    if record.metrics:
        keys = (
            "steps",
            "first_loss",
            "final_loss",
            "final_accuracy",
            "final_accept_len",
            "mean_tok_s",
            "wall_s",
        )
        shown = {k: record.metrics[k] for k in keys if k in record.metrics}
        console.print(f"metrics: {shown or record.metrics}")
    for note in record.notes:
        console.print(f"note: {note}")
    if baseline is None:
        console.print("No earlier successful run to compare with.")
        return
    if not changes:
        console.print(
            f"Environment identical to the last successful run {baseline.id} ({_fmt_tps(baseline)} tok/s)."
        )
        return
    table = Table(
        title=f"environment changes since the last successful run {baseline.id} ({_fmt_tps(baseline)} tok/s)"
    )
    for column in ("severity", "what", "before", "after"):
        table.add_column(column, overflow="fold")
    for change in changes:
        table.add_row(change["severity"], change["subject"], str(change["before"]), str(change["after"]))
    console.print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(runs_app, name="runs")
