"""`dflash-doctor runs` and `runs show ID`: past launches and refusals, and what changed since a good one.

Ids and paths are never cut (they are meant to be copied): the table's id and config columns do not wrap,
and in a pipe or a narrow terminal the table gives way to one tab-separated line per run.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dflash_base.errors import DoctorError
from dflash_doctor.commands.options import JsonOption
from dflash_doctor.console import make_console
from dflash_doctor.launch.run_curves import curves_of, non_finite_notes, plot_curves, sparkline_rows
from dflash_doctor.launch.run_outputs import finished_at
from dflash_doctor.launch.runs import RunRecord, RunStore, age, describe_age

RUNS_SCHEMA = "dflash-doctor/runs/v1"
RUN_SHOW_SCHEMA = "dflash-doctor/run-show/v1"
RUN_COMPARE_SCHEMA = "dflash-doctor/run-compare/v1"
TABLE_MIN_WIDTH = 120  # narrower than this (or not a terminal): one plain line per run
METRIC_LABELS = {
    "steps": "steps",
    "first_loss": "first loss",
    "final_loss": "final loss",
    "final_accuracy": "final accuracy",
    "final_accept_len": "acceptance length",
    "steady_tok_s": "tok/s",  # tokens / seconds over the steady steps
    "steady_steps": "steady steps",  # first, last
    "median_tok_s": "tok/s of the median step",  # the figure stands when it agrees with this one
    "mean_tok_s": "tok/s (a mean of step rates: an older record, up to 8% high)",
    "wall_s": "wall s",
}

runs_app = typer.Typer(help="Past launches: config, environment, verdicts, throughput, outcome.")

STATUS_STYLE = {
    "succeeded": "green",
    "failed": "red",
    "refused": "yellow",
    "interrupted": "yellow",
    "running": "cyan",
    "lost": "magenta",
}


def status_text(record: RunRecord) -> str:
    """`lost (last seen 5m ago)` for a run whose launcher vanished; else the status itself."""
    if record.status == "lost":
        seen = record.last_seen or record.created
        finished = finished_at(record.output_dir, record.created)
        if finished is not None:  # the launcher was killed, the workers went on to the end (N6)
            return f"lost (last seen {age(seen)}; its workers finished {age(finished)}: {record.output_dir}/summary.json)"
        return f"lost (last seen {age(seen)})"
    return record.status


def _fmt_tps(record: RunRecord) -> str:
    tps = record.tokens_per_second
    return "-" if tps is None else f"{tps:,.0f}"


@runs_app.callback(invoke_without_command=True)
def list_runs(
    ctx: typer.Context,
    json_out: bool = JsonOption,
    limit: int = typer.Option(20, "--limit", min=1, help="How many runs to list, newest first."),
) -> None:
    """List recent runs, newest first."""
    if ctx.invoked_subcommand is not None:
        return
    damaged: list[str] = []
    records = RunStore().all(damaged)[::-1][:limit]
    if json_out:
        document = {"schema": RUNS_SCHEMA, "runs": [r.to_json() for r in records], "damaged": damaged}
        typer.echo(json.dumps(document, indent=2, default=str))
        return
    console = make_console()
    errors = make_console(stderr=True)
    for line in damaged:
        errors.print(f"[yellow]warning:[/] skipped a damaged run record: {escape(line)}", soft_wrap=True)
    if not records:
        console.print("No runs yet. Launch one with `dflash-doctor train --config run.toml`.")
        return
    rows = [
        (
            r.id,
            describe_age(r),
            status_text(r),
            r.config_path or "-",
            _fmt_tps(r),
            _exit(r),
            ", ".join(r.forced_findings) or "-",
        )
        for r in records
    ]
    # Each column as wide as its longest cell, plus rich's padding and borders: when that does not fit,
    # the table would cut ids or paths, so plain lines instead.
    needed = sum(max(len(row[i]) for row in rows) + 3 for i in range(len(rows[0]))) + 1
    if not console.is_terminal or console.width < max(TABLE_MIN_WIDTH, needed):
        for row in rows:
            typer.echo("\t".join(row[:6]))
        return
    table = Table(title="dflash-doctor runs")
    for column in ("id", "when", "status", "config", "tok/s", "exit", "forced"):
        table.add_column(column, no_wrap=column in ("id", "config", "status"))
    for r, row in zip(records, rows, strict=True):
        style = STATUS_STYLE.get(r.status, "")
        table.add_row(row[0], row[1], f"[{style}]{escape(row[2])}[/]", escape(row[3]), *row[4:])
    console.print(table)


LAUNCHER_FAILED = "the launcher failed: "  # the note the launcher leaves when it dies before torchrun ends
NO_EXIT_CODE = {
    "refused": "no exit code: nothing was started",
    "running": "no exit code yet: still running",
    "lost": "no exit code: the launcher is gone without closing the record",
    "interrupted": "no exit code: stopped before the workers started",
    "failed": "no exit code: the launcher failed before the workers ended",
}


def exit_text(record: RunRecord) -> str:
    """`exit 0`, or why the record has no exit code (never `exit None`)."""
    if record.exit_code is not None:
        return f"exit {record.exit_code}"
    why = next((n.removeprefix(LAUNCHER_FAILED) for n in record.notes if n.startswith(LAUNCHER_FAILED)), None)
    if why is not None:
        return f"no exit code: the launcher failed ({why})"
    return NO_EXIT_CODE.get(record.status, "no exit code recorded")


def _exit(record: RunRecord) -> str:
    return "-" if record.exit_code is None else str(record.exit_code)


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
    plot: Path | None = typer.Option(
        None, "--plot", help="Draw the run's curves (loss, acceptance, tok/s over steps) into FILE.png."
    ),
) -> None:
    """Show one run; for a failed, refused or slow run, the environment diff against the last good one."""
    store = RunStore()
    record = store.load(run_id)
    if plot is not None:
        typer.echo(f"wrote {plot_curves([curves_of(record)], plot)}")
    baseline = store.last_successful(before=record)
    changes = environment_changes(record, baseline) if baseline is not None else []
    if json_out:
        document = {
            "schema": RUN_SHOW_SCHEMA,
            "run": record.to_json(),
            "baseline": baseline.id if baseline else None,
            "changes": changes,
        }
        typer.echo(json.dumps(document, indent=2, default=str))
        return
    console = make_console(soft_wrap=True)
    _print_record(console, record)
    _print_changes(console, baseline, changes)


def _print_record(console: Console, record: RunRecord) -> None:
    """One run as a person reads it: how it ended and why, its config and command, verdicts, summary, notes."""
    when = dt.datetime.fromtimestamp(record.created).isoformat(timespec="seconds")
    style = STATUS_STYLE.get(record.status, "")
    console.print(
        f"[bold]run {record.id}[/] · {when} · [{style}]{escape(status_text(record))}[/] · {escape(exit_text(record))}"
    )
    if record.reason:
        console.print(f"[red]why it failed:[/] {escape(record.reason)}")
    console.print(f"config: {escape(str(record.config_path))}")
    if record.command:
        console.print(f"command: {escape(' '.join(record.command))}")
    if record.forced_findings:
        forced = ", ".join(record.forced_findings)
        console.print(f"[yellow]launched over failing findings (--force): {forced}[/]")
    failing = [f for f in record.findings if f.get("severity") in ("fail", "warn")]
    for finding in failing:
        console.print(escape(f"  {finding.get('severity')}: {finding.get('id')}: {finding.get('summary')}"))
    summary = Table(title="summary", title_justify="left", show_header=False)
    summary.add_column("what")
    summary.add_column("value", overflow="fold")
    for label, value in metric_rows(record.metrics):
        summary.add_row(escape(label), escape(value))
    if summary.row_count:
        console.print(summary)
    _print_sparklines(console, record)
    if (drift := record.drift_finding) is not None:
        console.print(f"[yellow]note:[/] {escape(drift)}")
    for note in record.notes:
        console.print(f"note: {escape(note)}")
    if record.stderr_tail:
        console.print("the run's last lines on stderr (why it failed):")
        for line in record.stderr_tail:
            console.print(f"  {escape(line)}", highlight=False)


def _print_changes(console: Console, baseline: RunRecord | None, changes: list[dict[str, Any]]) -> None:
    """What changed in the environment since the last successful run (or that nothing did)."""
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


def metric_rows(metrics: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) the way a person reads them (not a Python dict), for the summary table."""
    rows = []
    for key, label in METRIC_LABELS.items():
        value = metrics.get(key)
        if value is not None:
            rows.append((label, _metric(value)))
    last = metrics.get("last_step")
    if isinstance(last, dict):  # a run stopped before its summary: its last metrics line
        shown = ", ".join(f"{k} {_metric(v)}" for k, v in last.items() if not isinstance(v, list))
        rows.append(("last step logged", shown))
    if metrics.get("status") not in (None, "ok"):
        error = f" ({metrics['error']})" if metrics.get("error") else ""
        rows.append(("trainer status", f"{metrics.get('status')}{error}"))
    return rows


def _print_sparklines(console: Console, record: RunRecord) -> None:
    """Loss, acceptance and tok/s over the run's steps, as text: a glance without an image viewer."""
    try:
        curves = curves_of(record)
    except DoctorError:
        return  # a refused run, or its output folder is gone: the summary is all there is
    rows = sparkline_rows(curves)
    if rows:
        table = Table(title="over the run's steps", title_justify="left", show_header=False)
        for _ in range(3):
            table.add_column()
        for name, span, line in rows:
            table.add_row(escape(name), escape(span), line)
        console.print(table)
    for note in non_finite_notes(curves):
        console.print(f"[yellow]note:[/] {escape(note)}")


@runs_app.command("compare")
def compare_runs(
    first: str = typer.Argument(..., help="A run id (a unique prefix is enough)."),
    second: str = typer.Argument(..., help="Another run id."),
    plot: Path | None = typer.Option(None, "--plot", help="Overlay both runs' curves in FILE.png."),
    json_out: bool = JsonOption,
) -> None:
    """Two runs side by side: their summaries, and (with --plot) their curves overlaid."""
    store = RunStore()
    records = [store.load(first), store.load(second)]
    if plot is not None:
        written = plot_curves([curves_of(r) for r in records], plot)
        if not json_out:
            typer.echo(f"wrote {written}")
    if json_out:
        document = {"schema": RUN_COMPARE_SCHEMA, "runs": [r.to_json() for r in records]}
        typer.echo(json.dumps(document, indent=2, default=str))
        return
    console = make_console(soft_wrap=True)
    table = Table(title=f"runs {records[0].id} and {records[1].id}", title_justify="left")
    table.add_column("what")
    for r in records:
        table.add_column(r.id, overflow="fold")
    rows = [dict(metric_rows(r.metrics)) for r in records]
    table.add_row("status", *(escape(status_text(r)) for r in records))
    table.add_row("config", *(escape(str(r.config_path)) for r in records))
    for label in dict.fromkeys(label for row in rows for label in row):
        table.add_row(escape(label), *(escape(row.get(label, "-")) for row in rows))
    console.print(table)


def _metric(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    if isinstance(value, list):
        return ", ".join(_metric(v) for v in value)
    return str(value)


def register(app: typer.Typer) -> None:
    app.add_typer(runs_app, name="runs")
