"""`dflash-doctor train --config run.toml`: gate, plan, warm the cache, launch torchrun, record.

Exit codes: 0 the run succeeded; 1 the gate refused (nothing started) or the run failed; 2 bad usage or
a bad config (nothing started, nothing recorded but the refusal).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dflash_doctor.commands.options import JsonOption, PythonOption, default_lock
from dflash_doctor.launch.gate import GateResult, load_training_config, run_gate
from dflash_doctor.launch.launcher import (
    prepare_compile_cache,
    read_summary,
    run_torchrun,
    snapshot_after_success,
)
from dflash_doctor.launch.memory_plan import GIB
from dflash_doctor.launch.plan import LaunchPlan, TorchrunOptions
from dflash_doctor.launch.runs import RunStore
from dflash_doctor.lock.lockfile import current_lock
from dflash_doctor.report import render


def _print_plan(console: Console, plan: LaunchPlan, gate: GateResult) -> None:
    table = Table(title="launch plan", title_justify="left")
    for column in ("rank", "role", "node", "device", "estimated peak"):
        table.add_column(column)
    for role in plan.roles:
        estimate = plan.memory.get(role.role)
        table.add_row(
            str(role.rank),
            role.role,
            str(role.node),
            role.device,
            f"{estimate.total / GIB:.1f} GiB" if estimate else "-",
        )
    console.print(table)
    for name, estimate in plan.memory.items():
        parts = ", ".join(f"{k} {v / GIB:.2f}" for k, v in estimate.parts.items())
        console.print(f"[dim]{name} memory (GiB): {parts}[/]")
    console.print(f"command: {escape(' '.join(plan.command))}")
    for key, value in plan.environ.items():
        console.print(f"env: {key}={escape(value)}")
    recommendation = gate.context.options.extra.get("split_recommendation")
    if recommendation:
        console.print(f"recommended split: {escape(str(recommendation))}")


def train_command(
    config: str = typer.Option(..., "--config", help="A training config (TOML) or a shipped config's name."),
    force: bool = typer.Option(False, "--force", help="Launch even over failing findings (recorded)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and the verdicts; start nothing."),
    deep: bool | None = typer.Option(
        None,
        "--deep/--no-deep",
        help="--deep: run the deep probe anew; --no-deep: no probe. Default: reuse the passed probe of this "
        "exact environment (lock, driver, GPUs), else probe.",
        show_default=False,
    ),
    python: str | None = PythonOption,
    overrides: list[str] = typer.Option([], "--set", help="Override a config field: --set optim.steps=50."),
    nnodes: int = typer.Option(1, "--nnodes", min=1, help="torchrun: number of nodes."),
    node_rank: int | None = typer.Option(None, "--node-rank", help="torchrun: this node's rank."),
    rdzv_backend: str | None = typer.Option(None, "--rdzv-backend", help="torchrun: rendezvous backend."),
    rdzv_endpoint: str | None = typer.Option(None, "--rdzv-endpoint", help="torchrun: host:port."),
    rdzv_id: str | None = typer.Option(None, "--rdzv-id", help="torchrun: job id."),
    master_addr: str | None = typer.Option(None, "--master-addr", help="torchrun: master address."),
    master_port: int | None = typer.Option(None, "--master-port", help="torchrun: master port."),
    json_out: bool = JsonOption,
) -> None:
    """Check the environment for this config; refuse on a failing finding; else launch with torchrun."""
    console = Console(highlight=False)
    began = time.perf_counter()  # the launcher's share of time to first step: gate + compile cache
    training = load_training_config(config, overrides)
    torchrun = TorchrunOptions(
        nnodes, node_rank, rdzv_backend, rdzv_endpoint, rdzv_id, master_addr, master_port
    )
    gate = run_gate(training, python, torchrun, deep=deep, lock_path=default_lock(None, False))
    gate_s = time.perf_counter() - began
    plan = gate.plan
    failing = [f.id for f in gate.failing]
    store = RunStore()
    common = dict(
        config_path=str(training.path),
        config_text=training.text,
        findings=[f.to_json() for f in gate.findings],
        command=plan.command,
        plan=plan.to_json(),
        output_dir=str(Path(training.config.output_dir).resolve()),
    )
    if json_out and dry_run:
        typer.echo(
            json.dumps({"plan": plan.to_json(), "findings": common["findings"], "failing": failing}, indent=2)
        )
        raise typer.Exit(1 if failing else 0)
    render(gate.runs, console, header=f"dflash-doctor train · {training.path}")
    if gate.probe_note:
        console.print(escape(gate.probe_note))
    _print_plan(console, plan, gate)
    if dry_run:
        raise typer.Exit(1 if failing else 0)
    environment = current_lock(gate.context).to_json()
    if failing and not force:
        record = store.create("refused", environment=environment, **common)
        console.print(
            f"[bold red]✗ launch refused[/]: {len(failing)} failing finding(s): {', '.join(failing)}. "
            f"Nothing was started (record {record.id}). Fix them, or --force to launch anyway."
        )
        raise typer.Exit(1)
    record = store.create("running", environment=environment, overrides=failing, **common)
    if failing:
        console.print(
            f"[yellow]! launching over failing findings (--force, recorded): {', '.join(failing)}[/]"
        )
    drafter_devices = tuple(
        dict.fromkeys(
            r.device for r in plan.roles if r.role == "drafter" and r.node == 0 and r.device != "cpu"
        )
    )
    prep = prepare_compile_cache(
        gate.context.env,
        gate.environ,
        training.path,
        plan.device_type,
        drafter_devices,
        tuple(training.overrides),
    )
    if gate.probe_note:
        record.notes.append(gate.probe_note)
    record.notes.append(f"compile cache: {prep.action}: {prep.detail} ({prep.seconds:.1f} s)")
    console.print(f"compile cache: {escape(prep.detail)}")
    before = (
        f"before torchrun: {time.perf_counter() - began:.1f} s (gate {gate_s:.1f} s, "
        f"compile cache {prep.seconds:.1f} s)"
    )
    record.notes.append(before)
    console.print(f"[dim]{before}[/]")
    store.save(record)
    started = time.time()
    code, interrupted = run_torchrun(plan.command, gate.environ)
    record.exit_code = code
    record.finished = time.time()
    record.metrics = read_summary(Path(record.output_dir or "."))
    record.status = "interrupted" if interrupted else ("succeeded" if code == 0 else "failed")
    if record.status == "succeeded":
        record.snapshot = snapshot_after_success(gate.context.env, gate.environ)
        record.notes.append(record.snapshot)
    store.save(record)
    took = record.finished - started
    style = "green" if record.status == "succeeded" else "red"
    console.print(
        f"[bold {style}]{record.status}[/] in {took:.0f} s · exit {code} · run {record.id}"
        + (f" · {record.tokens_per_second:,.0f} tok/s" if record.tokens_per_second else "")
    )
    if record.status != "succeeded":
        console.print(f"  see what changed since the last good run: dflash-doctor runs show {record.id}")
    raise typer.Exit(0 if record.status == "succeeded" else 1)


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)
