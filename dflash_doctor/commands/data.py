"""`dflash-doctor data ...`: the training data, made and checked with the target it will be trained for.

`data regenerate` answers every prompt (or every assistant turn of a chat) again with the target, greedy by
default, into the `data.kind = "chat"` format `train` reads. `data preview` shows the first records exactly
as the trainer will see them (supervised tokens highlighted) and counts over the whole file.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from dflash_base.errors import ConfigError, DoctorError
from dflash_doctor.commands.options import ConfigOption, JsonOption, SetOption
from dflash_doctor.console import make_console
from dflash_doctor.progress import ProgressLines, elapsed_text

if TYPE_CHECKING:
    from rich.text import Text

data_app = typer.Typer(
    name="data", help="Make and inspect training data with the target.", no_args_is_help=True
)

ENGINES = ("auto", "torch", "vllm")


def _local_devices(devices: str | None) -> list[str]:
    if devices:
        return [d.strip() for d in devices.split(",") if d.strip()]
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [f"cuda:{i}" for i in range(count)] or ["cpu"]


def _engine_factory(engine: str, settings: object, devices: list[str], batch_size: int | None, tp: int):
    from trainer.api import DevicePool, VllmEngine, torch_engine, vllm_available

    if engine == "vllm" or (engine == "auto" and vllm_available()):
        if not vllm_available():
            raise DoctorError(
                "--engine vllm: vLLM is not installed here", hint="pip install vllm, or --engine torch"
            )
        return lambda: VllmEngine(settings, tensor_parallel_size=tp)  # type: ignore[arg-type]
    if len(devices) == 1:
        return lambda: torch_engine(settings, devices[0], batch_size)  # type: ignore[arg-type]
    return lambda: DevicePool(settings, devices, batch_size)  # type: ignore[arg-type]


def regenerate_command(
    config: ConfigOption,
    prompts: Path = typer.Option(..., "--prompts", help='JSONL: {"messages": [...]} or {"prompt": "..."}.'),
    out: Path = typer.Option(..., "--out", help="JSONL written in the chat format; re-run to resume."),
    max_new_tokens: int = typer.Option(1024, "--max-new-tokens", min=1, help="Longest answer, in tokens."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Only the first N input records."),
    engine: str = typer.Option("auto", "--engine", help="auto (vLLM when installed), torch, or vllm."),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 is greedy (the default)."),
    top_p: float = typer.Option(
        1.0, "--top-p", min=0.0, max=1.0, help="Nucleus sampling (with --temperature)."
    ),
    on_error: str = typer.Option("stop", "--on-error", help="A bad input line: stop (exit 2) or skip it."),
    force: bool = typer.Option(False, "--force", help="--out was made with other settings: start over."),
    devices: str | None = typer.Option(
        None, "--devices", help="torch engine: e.g. cuda:0,cuda:1 (default: all)."
    ),
    batch_size: int | None = typer.Option(
        None,
        "--batch-size",
        min=1,
        help="torch engine: rows decoded at once (default: 2,048 on a GPU, or what fits its memory; 8 on a CPU).",
    ),
    tensor_parallel: int = typer.Option(1, "--tensor-parallel", min=1, help="vllm engine: GPUs per model."),
    set_: SetOption = None,
    commit_every: float = typer.Option(
        60.0,
        "--commit-every",
        min=1.0,
        help="Seconds of work per commit to --out (the chunk of conversations adapts to the pace): a kill loses at most about this.",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Answer the prompts with the target itself (greedy), so the drafter learns what the target will say."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from trainer.api import (
        GenerationSettings,
        check_prompt_lengths,
        check_supervisable,
        regenerate,
        scan_input,
    )
    from trainer.spec.config import load_config

    if engine not in ENGINES:
        raise ConfigError(f"--engine: must be one of {', '.join(ENGINES)}, got {engine!r}")
    if on_error not in ("stop", "skip"):
        raise ConfigError(f"--on-error: must be stop or skip, got {on_error!r}")
    cfg = load_config(config, set_, check_data=False, drafter=False)  # generation needs no drafter setting
    template_kwargs = dict(getattr(cfg.data, "chat_template_kwargs", None) or {})
    settings = GenerationSettings(
        target=cfg.target.path,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        chat_template_kwargs=template_kwargs,
        seed=cfg.run.seed,
    )
    scan = check_prompt_lengths(scan_input(prompts, on_error), settings, on_error)  # before the target loads
    check_supervisable(settings)  # a template train cannot supervise: refused before any answer is paid for
    err = make_console(stderr=True)
    for bad in scan.bad[:5]:
        err.print(f"[yellow]skipped[/] {prompts} {bad}")
    if len(scan.bad) > 5:
        err.print(f"[yellow]skipped[/] {len(scan.bad) - 5} more bad lines")
    local = _local_devices(devices)
    factory = _engine_factory(engine, settings, local, batch_size, tensor_parallel)
    progress = Progress(
        TextColumn("regenerating"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
        console=err,
        disable=json_out or not err.is_terminal,
    )
    task = progress.add_task("", total=None, rate="")
    began = time.monotonic()
    seen: dict[str, Any] = {}  # the latest summary and count to do, for the lines a pipe gets

    def show(summary: Any, todo: int) -> None:
        tok_s = summary.generated_tokens / summary.seconds if summary.seconds else 0.0
        progress.update(task, total=todo, completed=summary.written, rate=f"{tok_s:,.0f} tok/s")
        first = not seen
        seen.update(summary=summary, todo=todo)
        if lines is not None and not first:  # a chunk was written (the first call only counts the work)
            lines.moved()

    def describe() -> str:
        summary, todo = seen.get("summary"), seen.get("todo")
        when = elapsed_text(time.monotonic() - began)
        if summary is None:
            return f"regenerating: reading the input and loading the target, {when} in"
        tok_s = summary.generated_tokens / summary.seconds if summary.seconds else 0.0
        return (
            f"regenerating: {summary.written:,} of {todo:,} conversations written, {summary.answers:,} answers, "
            f"{summary.generated_tokens:,} tokens ({tok_s:,.0f} tok/s), {when} in"
        )

    # In a terminal the bar moves; elsewhere (a pipe, a log) a line per chunk and at least every 30 s.
    lines = None if err.is_terminal else ProgressLines(describe, lambda line: err.print(line, soft_wrap=True))
    try:
        with progress, lines or contextlib.nullcontext():
            summary = regenerate(
                scan,
                out,
                settings,
                factory,
                limit=limit,
                force=force,
                commit_every_s=commit_every,
                on_progress=show,
            )
    except KeyboardInterrupt:
        err.print(f"stopped: every line in {out} is whole; run the same command again to resume")
        raise typer.Exit(130) from None
    report = summary.to_json() | {"out": str(out)}
    if json_out:
        typer.echo(json.dumps(report, indent=2))
    else:
        print(
            f"wrote {summary.written} conversations to {out} ({summary.skipped_done} already there, "
            f"{summary.skipped_bad} bad lines skipped); {summary.answers} answers, "
            f"{summary.stopped_at_length} cut at --max-new-tokens; "
            f"{report['generated_tokens_per_s']:,.0f} generated tok/s",
            file=sys.stdout,
        )
        if summary.written or summary.skipped_done:
            print(f'train on it with: data.kind = "chat", data.path = "{os.path.abspath(out)}"')
    if summary.stopped_at_length:
        share = summary.stopped_at_length / max(summary.answers, 1)
        err.print(
            f"[yellow]![/] {summary.stopped_at_length} of {summary.answers} answers ({share:.0%}) stopped at "
            f"--max-new-tokens {max_new_tokens}: the drafter will learn answers cut short where the target would "
            "have gone on; raise --max-new-tokens (re-run with --force) if that is most of them",
            soft_wrap=True,
        )
    raise typer.Exit(0)


def _sample_text(sample: dict[str, Any], supervised_style: str) -> Text:
    """The sample's real tokens (ids where there is no tokenizer); supervised ones highlighted, the rest dim."""
    from rich.text import Text

    real = sample["real_tokens"]
    pieces = sample["tokens"] or [f"{t} " for t in sample["input_ids"][:real]]
    text = Text()
    for piece, on in zip(pieces, sample["loss_mask"][:real], strict=True):
        text.append(piece, style=supervised_style if on else "dim")
    return text


def preview_command(
    config: ConfigOption,
    samples: int = typer.Option(3, "--samples", min=0, help="Records to show (the first N, in file order)."),
    overrides: SetOption = None,
    json_out: bool = JsonOption,
) -> None:
    """The first records tokenised, truncated and padded as in training (supervised tokens highlighted), and
    counts over the whole data: sequences, tokens, supervised share, truncated share."""
    from rich.markup import escape

    from trainer.api import preview
    from trainer.spec.config import load_config

    cfg = load_config(config, overrides)
    result = preview(cfg, samples).to_json()
    if json_out:
        typer.echo(json.dumps(result))
        return
    console = make_console()
    for sample in result["samples"]:
        where = f"line {sample['line']}" if sample["line"] is not None else f"sequence {sample['index']}"
        flag = "  [yellow](truncated)[/]" if sample["truncated"] else ""
        supervised = sum(sample["loss_mask"])
        console.print(f"[bold]{escape(where)}[/]: {supervised} supervised tokens{flag}")
        console.print(_sample_text(sample, "bold green"))
        console.print()
    c = result["counts"]
    console.print(
        f"{c['sequences']} sequences ({escape(result['kind'])}, seq_len {result['seq_len']}): {c['tokens']:,} tokens, "
        f"{c['supervised_share']:.1%} supervised, {c['truncated_share']:.1%} of sequences truncated"
    )
    console.print("[dim]supervised tokens in [bold green]green[/], the rest dim[/]")


data_app.command("regenerate")(regenerate_command)
data_app.command("preview")(preview_command)


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
