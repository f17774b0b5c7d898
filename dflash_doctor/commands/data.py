"""`dflash-doctor data ...`: the training data, made and checked with the target it will be trained for.

`data regenerate` answers every prompt (or every assistant turn of a chat) again with the target, greedy by
default or sampled (`--temperature`, `--samples-per-prompt`), into the `data.kind = "chat"` format `train` reads. `data preview` shows the first records exactly
as the trainer will see them (supervised tokens highlighted) and counts over the whole file.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dflash_doctor.commands.options import ConfigOption, JsonOption, SetOption
from dflash_doctor.console import make_console
from dflash_doctor.progress import RegenerateProgress
from trainer.runspec.regenerate_request import DEFAULTS as R
from trainer.runspec.regenerate_request import RegenerateRequest

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

data_app = typer.Typer(
    name="data", help="Make and inspect training data with the target.", no_args_is_help=True
)


def _engine_factory(request: RegenerateRequest, settings: Any) -> Any:
    """What makes the engine (trainer.regenerate.engines chooses it); the seam the command's tests replace."""
    from trainer.api import engine_factory, local_devices

    devices = local_devices(request.devices)
    return engine_factory(request.engine, settings, devices, request.batch_size, request.tensor_parallel)


# The options, one type each (as eval's): the command's signature then reads one line per option; each
# default is the request's (trainer.runspec.regenerate_request.DEFAULTS).
PromptsOption = Annotated[
    Path, typer.Option("--prompts", help='JSONL: {"messages": [...]} or {"prompt": "..."}.')
]
OutOption = Annotated[Path, typer.Option("--out", help="JSONL written in the chat format; re-run to resume.")]
MaxNewTokensOption = Annotated[int, typer.Option("--max-new-tokens", help="Longest answer, in tokens.")]
LimitOption = Annotated[int | None, typer.Option("--limit", help="Only the first N input records.")]
EngineOption = Annotated[str, typer.Option("--engine", help="auto (vLLM when installed), torch, or vllm.")]
TemperatureOption = Annotated[float, typer.Option("--temperature", help="0 is greedy (the default).")]
TopPOption = Annotated[
    float, typer.Option("--top-p", help="Nucleus sampling (with --temperature), in (0, 1].")
]
SamplesPerPromptOption = Annotated[
    int,
    typer.Option("--samples-per-prompt", help="Answers per prompt (ids <id>#1, #2...: sample 0 keeps <id>)."),
]
SeedOption = Annotated[
    int, typer.Option("--seed", help="Sampled answers: each drawn from (seed, prompt id, sample).")
]
OnErrorOption = Annotated[str, typer.Option("--on-error", help="A bad input line: stop (exit 2) or skip it.")]
ForceOption = Annotated[bool, typer.Option("--force", help="--out was made with other settings: start over.")]
DevicesOption = Annotated[
    str | None, typer.Option("--devices", help="torch engine: e.g. cuda:0,cuda:1 (default: all).")
]
BatchSizeOption = Annotated[
    int | None,
    typer.Option(
        "--batch-size",
        help="torch engine: rows decoded at once (default: 2,048 on a GPU, or what fits its memory; 8 on a CPU).",
    ),
]
TensorParallelOption = Annotated[int, typer.Option("--tensor-parallel", help="vllm engine: GPUs per model.")]
CommitEveryOption = Annotated[
    float,
    typer.Option(
        "--commit-every",
        help="Seconds of work per commit to --out (the chunk of conversations adapts to the pace): a kill loses at most about this.",
    ),
]


def regenerate_command(
    config: ConfigOption,
    prompts: PromptsOption,
    out: OutOption,
    max_new_tokens: MaxNewTokensOption = R.max_new_tokens,
    limit: LimitOption = R.limit,
    engine: EngineOption = R.engine,
    temperature: TemperatureOption = R.temperature,
    top_p: TopPOption = R.top_p,
    samples_per_prompt: SamplesPerPromptOption = R.samples_per_prompt,
    seed: SeedOption = R.seed,
    on_error: OnErrorOption = R.on_error,
    force: ForceOption = R.force,
    devices: DevicesOption = R.devices,
    batch_size: BatchSizeOption = R.batch_size,
    tensor_parallel: TensorParallelOption = R.tensor_parallel,
    set_: SetOption = None,
    commit_every: CommitEveryOption = R.commit_every,
    json_out: bool = JsonOption,
) -> None:
    """Answer the prompts with the target itself (greedy; --temperature T samples, --samples-per-prompt N answers
    each prompt N times), so the drafter learns what the target will say."""
    request = RegenerateRequest(
        config=config,
        prompts=prompts,
        out=out,
        overrides=tuple(set_ or ()),
        max_new_tokens=max_new_tokens,
        limit=limit,
        engine=engine,
        temperature=temperature,
        top_p=top_p,
        samples_per_prompt=samples_per_prompt,
        seed=seed,
        on_error=on_error,
        force=force,
        devices=devices,
        batch_size=batch_size,
        tensor_parallel=tensor_parallel,
        commit_every=commit_every,
        json_out=json_out,
    )
    request.validate()  # bad options: exit 2 before torch is imported
    from trainer.api import prepare_regeneration

    settings, scan = prepare_regeneration(request)  # bad lines, prompts past the context: before the target
    err = make_console(stderr=True)
    for bad in scan.bad[:5]:
        err.print(f"[yellow]skipped[/] {request.prompts} {bad}")
    if len(scan.bad) > 5:
        err.print(f"[yellow]skipped[/] {len(scan.bad) - 5} more bad lines")
    summary = _regenerate_with_progress(request, settings, scan, err)
    _print_summary(summary, request, err)
    raise typer.Exit(0)


def _regenerate_with_progress(request: RegenerateRequest, settings: Any, scan: Any, err: Console) -> Any:
    """The regeneration, with its progress on stderr; Ctrl-C: exit 130, every line written whole."""
    from trainer.api import regenerate

    factory = _engine_factory(request, settings)
    progress = RegenerateProgress(err, quiet=request.json_out)
    try:
        with progress:
            return regenerate(
                scan, request.out, settings, factory, limit=request.limit, force=request.force,
                commit_every_s=request.commit_every, on_progress=progress.show,
                samples_per_prompt=request.samples_per_prompt, on_tokens=progress.tokens,
            )  # fmt: skip
    except KeyboardInterrupt as stop:  # what was kept and what was dropped (job.RegenerateStopped)
        describe = getattr(stop, "describe", None)
        err.print(describe() if callable(describe) else f"stopped: every line in {request.out} is whole")
        raise typer.Exit(130) from None


def _print_summary(summary: Any, request: RegenerateRequest, err: Console) -> None:
    """stdout: the summary (text, or --json's one document); stderr: a warning when many answers were cut."""
    report = summary.to_json() | {"out": str(request.out)}
    if request.json_out:
        typer.echo(json.dumps(report, indent=2))
    else:
        print(regenerate_text(summary, report, request.out), file=sys.stdout)
    if summary.stopped_at_length:
        err.print(cut_short_warning(summary, request.max_new_tokens), soft_wrap=True)


def regenerate_text(summary: Any, report: dict[str, Any], out: Path) -> str:
    """The summary a person reads: what was written, what was cut or looped, and how to train on it."""
    text = (
        f"wrote {summary.written} conversations to {out} ({summary.skipped_done} already there, "
        f"{summary.skipped_bad} bad lines skipped{_dropped(summary)}); {summary.answers} answers, "
        f"{summary.stopped_at_length} cut at --max-new-tokens, {summary.ended_in_loop} ending in a "
        f"repetition loop ({summary.loops_at_length} of them at --max-new-tokens); "
        f"{report['generated_tokens_per_s']:,.0f} generated tok/s"
    )
    roofline = (report.get("engine") or {}).get("roofline")
    if roofline:  # the KV engine on a GPU whose peaks are known
        text += (
            f" (decode alone {roofline['decode_tok_s']:,.0f} tok/s, {roofline['share_of_roofline']:.0%} of what its"
            f" bytes and FLOPs allow at this GPU's peaks: {roofline['roofline_tok_s']:,.0f} tok/s)"
        )
    if summary.written or summary.skipped_done:
        text += f'\ntrain on it with: data.kind = "chat", data.path = "{os.path.abspath(out)}"'
    return text


def _dropped(summary: Any) -> str:
    """Lines of --out that repeated an id, dropped on resume (two runs into one file; issue 58, N5)."""
    count = getattr(summary, "duplicates_dropped", 0)
    return f", {count} duplicate lines dropped (an id written twice)" if count else ""


def cut_short_warning(summary: Any, max_new_tokens: int) -> str:
    share = summary.stopped_at_length / max(summary.answers, 1)
    return (
        f"[yellow]![/] {summary.stopped_at_length} of {summary.answers} answers ({share:.0%}) stopped at "
        f"--max-new-tokens {max_new_tokens}: the drafter trains on their beginnings only (the end-of-turn token "
        "after them is not supervised: the target did not write it); raise --max-new-tokens (re-run with --force) "
        "if that is most of them"
    )


SUPERVISED_OPEN, SUPERVISED_CLOSE = (
    "⟦",
    "⟧",
)  # around each run of supervised tokens: a pipe and NO_COLOR keep them


def _sample_text(sample: dict[str, Any], supervised_style: str) -> Text:
    """The sample's real tokens (ids where there is no tokenizer); each run of supervised ones between
    SUPERVISED_OPEN and SUPERVISED_CLOSE (and in `supervised_style` where colour shows), the rest dim. The
    brackets carry the marking where styles do not: a pipe, a log, NO_COLOR."""
    from rich.text import Text

    real = sample["real_tokens"]
    pieces = sample["tokens"] or [f"{t} " for t in sample["input_ids"][:real]]
    text = Text()
    inside = False
    for piece, on in zip(pieces, sample["loss_mask"][:real], strict=True):
        if bool(on) != inside:
            text.append(SUPERVISED_OPEN if on else SUPERVISED_CLOSE, style="bold")
            inside = bool(on)
        text.append(piece, style=supervised_style if on else "dim")
    if inside:
        text.append(SUPERVISED_CLOSE, style="bold")
    return text


def preview_command(
    config: ConfigOption,
    samples: int = typer.Option(3, "--samples", min=0, help="Records to show (the first N, in file order)."),
    overrides: SetOption = None,
    json_out: bool = JsonOption,
) -> None:
    """The first records tokenised, truncated and padded as in training (supervised tokens bracketed), and
    counts over the whole data: sequences, tokens, supervised share, truncated share."""
    from rich.markup import escape

    from trainer.api import preview
    from trainer.runspec.config import load_config

    # the whole data file is shown, not a split: the held-out and step-size rules are train's and eval's
    cfg = load_config(config, overrides, split=False)
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
    if c["answers_cut_at_length"] or c["answers_loop_cut"] or c["answers_loop_dropped"]:
        loops = f"{c['answers_loop_cut']:,} ending in a loop cut after its first period (data.loops)"
        if c["answers_loop_dropped"]:
            loops = f"{c['answers_loop_dropped']:,} ending in a loop not supervised at all (data.loops)"
        console.print(
            f"{c['answers_cut_at_length']:,} answers cut at the length cap (their end-of-turn token not "
            f"supervised), {loops}: {c['tokens_left_out_at_answer_ends']:,} tokens left out of the loss"
        )
    console.print(
        f"supervised tokens between {SUPERVISED_OPEN} and {SUPERVISED_CLOSE} (green where colour shows); "
        "the rest is context the drafter sees but is not trained to write"
    )


data_app.command("regenerate")(regenerate_command)
data_app.command("preview")(preview_command)


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
