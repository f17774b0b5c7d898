"""`dflash-doctor train --config run.toml`: gate, plan, warm the cache, launch torchrun, record.

Exit codes: 0 the run succeeded; 1 the gate refused (nothing started) or the run failed; 2 bad usage, a
bad config or an output folder another run holds (nothing started, nothing recorded but the refusal);
128+N the run was stopped by signal N (SIGINT: 130, SIGTERM: 143), recorded as `interrupted`.

With --json the human report goes to stderr (torchrun's output too) and stdout carries one JSON document.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dflash_base.disk import size_text
from dflash_doctor.commands.options import (
    FLAG,
    ConfigOption,
    JsonOption,
    PythonOption,
    SetOption,
    default_lock,
)
from dflash_doctor.console import make_console
from dflash_doctor.launch.gate import GateResult, TrainingConfig, load_training_config, run_gate
from dflash_doctor.launch.lifecycle import EarlyWarmUp, LaunchRequest, launch_run
from dflash_doctor.launch.link import DEFAULT_JOIN_TIMEOUT_S
from dflash_doctor.launch.memory_plan import CPU_FLOOR_NOTE, GIB
from dflash_doctor.launch.plan import LaunchPlan, RoleAssignment, TorchrunOptions
from dflash_doctor.launch.runs import RunRecord, RunStore
from dflash_doctor.launch.timeline import LaunchTimeline
from dflash_doctor.lock.lockfile import current_lock
from dflash_doctor.report import render
from trainer.runspec.mask_token import mask_token_of

TRAIN_SCHEMA = "dflash-doctor/train/v1"


def _print_plan(console: Console, plan: LaunchPlan, gate: GateResult, training: TrainingConfig) -> None:
    table = Table(title="launch plan", title_justify="left")
    for column in ("rank", "role", "node", "device", "pairs", "estimated peak"):
        table.add_column(column)
    for role in _shown_roles(plan.roles):
        if role is None:
            table.add_row("…", f"{len(plan.roles) - 2 * PLAN_ROWS_EACH_END} more ranks", "", "", "", "")
            continue
        estimate = plan.memory.get(role.role)
        floor = ">= " if plan.memory_is_floor else ""  # on CPU a lower bound (memory_plan.CPU_FLOOR_NOTE)
        table.add_row(
            str(role.rank),
            role.role,
            str(role.node),
            role.device,
            role.peers_text,
            f"{floor}{estimate.total / GIB:.1f} GiB" if estimate else "-",
        )
    console.print(table)
    for name, estimate in plan.memory.items():
        parts = ", ".join(f"{k} {v / GIB:.2f}" for k, v in estimate.parts.items())
        console.print(f"[dim]{name} memory (GiB): {parts}[/]", soft_wrap=True)
    if plan.memory_is_floor:
        console.print(f"memory: {escape(CPU_FLOOR_NOTE)}", soft_wrap=True)
    if plan.disk:  # what the run writes, at its peak (launch.disk compares it with the free space)
        writes = "; ".join(
            f"{w.what} {size_text(w.bytes)}"
            + (f" ({w.bytes // w.each} x {size_text(w.each)})" if w.each and w.bytes > w.each else "")
            + f" in {w.path}"
            for w in plan.disk
        )
        console.print(f"[dim]disk at the peak: {escape(writes)}[/]", soft_wrap=True)
    if plan.time is not None:  # steps x a measured, projected or declared step time (launch/time_plan.py)
        console.print(escape(plan.time.line()), soft_wrap=True)
    console.print(f"command: {escape(shlex.join(plan.command))}", soft_wrap=True)  # pastes whole
    for key, value in plan.environ.items():
        console.print(f"env: {key}={escape(shlex.quote(value))}", soft_wrap=True)
    mask = mask_token_of(training.config)
    shown = f" {mask['text']!r}" if mask["text"] is not None else " (a row no token uses)"
    console.print(f"mask token: {mask['id']}{escape(shown)}, chosen by {escape(str(mask['rule']))}")
    if plan.choice is not None:  # the topology and why: both designs' projections side by side
        for line in plan.choice.lines():
            console.print(escape(line))
    recommendation = gate.context.options.extra.get("split_recommendation")
    if recommendation and plan.mode == "split":
        console.print(f"recommended split: {escape(str(recommendation))}")


PLAN_ROWS_EACH_END = 8  # a plan of more ranks shows its first and last few, the rest as one row


def _shown_roles(roles: list[RoleAssignment]) -> list[RoleAssignment | None]:
    """Every rank of a small plan; of a large one the first and last few, None standing for the rest."""
    if len(roles) <= 2 * PLAN_ROWS_EACH_END + 1:
        return list(roles)
    return [*roles[:PLAN_ROWS_EACH_END], None, *roles[-PLAN_ROWS_EACH_END:]]


# The options, one type each (as eval's): the command's signature then reads one line per option.
ForceOption = Annotated[
    bool, typer.Option("--force", metavar=FLAG, help="Launch even over failing findings (recorded).")
]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", metavar=FLAG, help="Print the plan and the verdicts; start nothing.")
]
DeepOption = Annotated[
    bool | None,
    typer.Option(
        "--deep/--no-deep",
        metavar=FLAG,
        help="--deep: run the deep probe anew; --no-deep: no probe. Default: reuse the passed probe of this "
        "exact environment (lock, driver, GPUs), else probe.",
        show_default=False,
    ),
]
NnodesOption = Annotated[int, typer.Option("--nnodes", min=1, help="torchrun: number of nodes.")]
NodeRankOption = Annotated[int | None, typer.Option("--node-rank", help="torchrun: this node's rank.")]
RdzvBackendOption = Annotated[
    str | None, typer.Option("--rdzv-backend", help="torchrun: rendezvous backend.")
]
RdzvEndpointOption = Annotated[str | None, typer.Option("--rdzv-endpoint", help="torchrun: host:port.")]
RdzvIdOption = Annotated[str | None, typer.Option("--rdzv-id", help="torchrun: job id.")]
MasterAddrOption = Annotated[str | None, typer.Option("--master-addr", help="torchrun: master address.")]
MasterPortOption = Annotated[int | None, typer.Option("--master-port", help="torchrun: master port.")]
JoinTimeoutOption = Annotated[
    float,
    typer.Option(
        "--join-timeout",
        min=1.0,
        metavar="SECONDS",
        help="Several nodes: how long the gate waits for the rendezvous endpoint to answer and every node to "
        "join its link check (exit 2 past it, nothing started).",
    ),
]


def train_command(
    context: typer.Context,
    config: ConfigOption,
    force: ForceOption = False,
    dry_run: DryRunOption = False,
    deep: DeepOption = None,
    python: str | None = PythonOption,
    overrides: SetOption = None,
    nnodes: NnodesOption = 1,
    node_rank: NodeRankOption = None,
    rdzv_backend: RdzvBackendOption = None,
    rdzv_endpoint: RdzvEndpointOption = None,
    rdzv_id: RdzvIdOption = None,
    master_addr: MasterAddrOption = None,
    master_port: MasterPortOption = None,
    join_timeout: JoinTimeoutOption = DEFAULT_JOIN_TIMEOUT_S,
    json_out: bool = JsonOption,
) -> None:
    """Check the environment for this config; refuse on a failing finding; else launch with torchrun (one
    process in all: the rank itself, `topology.launcher`)."""
    console = make_console(stderr=json_out)
    began = time.perf_counter()  # the launcher's share of time to first step: gate + compile cache
    timeline = LaunchTimeline.from_process_start()  # where each second to the first step goes (--json, -v)
    training = load_training_config(config, overrides or [])
    torchrun = TorchrunOptions(
        nnodes=nnodes,
        node_rank=node_rank,
        rdzv_backend=rdzv_backend,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_id=rdzv_id,
        master_addr=master_addr,
        master_port=master_port,
    )
    early = EarlyWarmUp(json_out=json_out, timeline=timeline)
    try:
        link = None if dry_run else join_timeout  # --dry-run meets no other node
        gate = _gate(training, python, torchrun, deep, early, link, force=force)
        request = LaunchRequest(
            training=training,
            gate=gate,
            failing=[f.id for f in gate.failing],
            began=began,
            gate_s=time.perf_counter() - began,
            node_rank=node_rank or 0,
            nnodes=nnodes,
            json_out=json_out,
            timeline=timeline,
            verbose=bool(context.find_root().params.get("verbose")),
            early=early,
        )
        _show_gate(console, gate, training, dry_run, json_out)  # --dry-run ends there
        record = _launch_or_refuse(request, force, console)
        _print_json(record, request.failing, json_out)
    finally:
        early.stop()  # a refusal, an output folder another run holds, our own unwinding: nothing left running
    raise typer.Exit(_exit_code(record))


def _gate(
    training: TrainingConfig,
    python: str | None,
    torchrun: TorchrunOptions,
    deep: bool | None,
    early: EarlyWarmUp,
    join_timeout: float | None,
    force: bool,
) -> GateResult:
    """The checks, with the compile cache warmed beside them once the checks it depends on pass (a lone
    rank: the rank itself), and over several nodes the link check waiting up to `join_timeout` for the others;
    `join_timeout` None (--dry-run): neither. A refusal stops that warm-up before anything is recorded."""
    warm = join_timeout is not None
    gate = run_gate(
        training,
        python,
        torchrun,
        deep=deep,
        lock_path=default_lock(None, False),
        timeline=early.timeline,
        on_warm_up_ready=(lambda first: early.start(first, training, force)) if warm else None,
        join_timeout_s=join_timeout,
    )
    if gate.failing and not force:
        early.stop()  # refused: stopped before anything is recorded
    return gate


def _show_gate(
    console: Console, gate: GateResult, training: TrainingConfig, dry_run: bool, json_out: bool
) -> None:
    """The verdicts, the probe's note and the launch plan; --dry-run ends here (exit 1 on a failing finding)."""
    failing = [f.id for f in gate.failing]
    if json_out and dry_run:
        typer.echo(json.dumps(_dry_run_document(gate, training, failing), indent=2, default=str))
        raise typer.Exit(1 if failing else 0)
    render(gate.runs, console, header=f"dflash-doctor train · {training.path}")
    if gate.probe_note:
        console.print(escape(gate.probe_note))
    _print_plan(console, gate.plan, gate, training)
    for note in training.notes:  # what a --set replaced in the file (U14b)
        console.print(f"[yellow]note:[/] {escape(note)}")
    if dry_run:
        raise typer.Exit(1 if failing else 0)


def _launch_or_refuse(request: LaunchRequest, force: bool, console: Console) -> RunRecord:
    """A failing finding without --force: a `refused` record, nothing started. Else the launch's record."""
    store, common = RunStore(), _record_fields(request.gate, request.training)
    environment = current_lock(request.gate.context).to_json()
    failing = request.failing
    if failing and not force:
        early = request.early  # a lone rank started beside the gate took the run's id (and stopped)
        run_id = early.run_id if early is not None else None
        record = store.create("refused", environment=environment, run_id=run_id, **common)
        if early is not None:
            early.recorded = True  # its folder is the refusal's record now
        console.print(
            f"[bold red]✗ launch refused[/]: {len(failing)} failing finding(s): {', '.join(failing)}. "
            f"Nothing was started (record {record.id}). Fix them, or --force to launch anyway.",
            soft_wrap=True,
        )
        return record
    return launch_run(request, store, common, environment, console)


def _record_fields(gate: GateResult, training: TrainingConfig) -> dict[str, Any]:
    """What every record of this launch carries, refused or run: the config, the verdicts, the plan."""
    return dict(
        config_path=str(training.path),
        config_text=training.text,
        findings=[f.to_json() for f in gate.findings],
        command=gate.plan.command,
        plan=gate.plan.to_json(),
        output_dir=str(Path(training.config.output_dir).resolve()),
    )


def _dry_run_document(gate: GateResult, training: TrainingConfig, failing: list[str]) -> dict[str, Any]:
    """`train --dry-run --json`: the plan and the verdicts, nothing recorded."""
    return {
        "schema": TRAIN_SCHEMA,
        "status": "dry-run",
        "plan": gate.plan.to_json(),
        "mask_token": mask_token_of(training.config),
        "findings": [f.to_json() for f in gate.findings],
        "failing": failing,
        "notes": training.notes,
    }


def _print_json(record: RunRecord, failing: list[str], json_out: bool) -> None:
    """With --json, stdout's one document: how the launch ended and its record."""
    if json_out:
        document = {
            "schema": TRAIN_SCHEMA,
            "status": record.status,
            "failing": failing,
            "run": record.to_json(),
        }
        typer.echo(json.dumps(document, indent=2, default=str))


def _exit_code(record: RunRecord) -> int:
    """0 succeeded; 128+N interrupted by signal N; 1 otherwise (failed)."""
    if record.status == "interrupted" and record.exit_code is not None:
        return record.exit_code
    return 0 if record.status == "succeeded" else 1


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)
