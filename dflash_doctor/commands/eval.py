"""`dflash-doctor eval --export DIR --config RUN.toml`: real greedy speculative decoding with the drafter.

Exit codes: 0 every prompt's speculative output equals target-only greedy decoding's, bitwise or up to a
near-tie flip (bf16 rounding: the report names each); 1 an output really differs (a bug to report), or, with
--strict, any output is not bitwise identical; 2 bad usage, a bad config, export, prompts file or tolerance.
"""

from __future__ import annotations

import json
import sys

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from dflash_doctor.commands.options import FLAG, JsonOption
from dflash_doctor.console import make_console
from trainer.spec.eval_request import DEFAULTS, EvalRequest


def eval_command(
    export: str | None = typer.Option(
        None,
        "--export",
        help="The drafter's export folder (config.json + safetensors); not for --drafter ngram.",
    ),
    config: str | None = typer.Option(
        None,
        "--config",
        help="The run's config: its target, seed and held-out sequences (the default prompts).",
    ),
    target: str | None = typer.Option(
        None, "--target", help="The target (default: the config's target.path)."
    ),
    prompts: str | None = typer.Option(
        None, "--prompts", help='A JSONL of {"prompt"}, {"messages"} or {"input_ids"} records.'
    ),
    num_prompts: int = typer.Option(
        DEFAULTS.num_prompts, "--num-prompts", help="Prompts to decode (the first N)."
    ),
    prompt_len: int = typer.Option(
        DEFAULTS.prompt_len, "--prompt-len", help="Held-out prompts: the tokens of each kept."
    ),
    max_new_tokens: int = typer.Option(
        DEFAULTS.max_new_tokens, "--max-new-tokens", help="New tokens per prompt."
    ),
    device: str = typer.Option(DEFAULTS.device, "--device", help="auto | cpu | cuda"),
    overrides: list[str] = typer.Option([], "--set", help="Override a config field: --set data.seq_len=256."),
    tie_tolerance: float | None = typer.Option(
        None,
        "--tie-tolerance",
        help="A first difference counts as a near-tie flip (exit 0) when each decode rates the other's token "
        "within this many logits, times max(1, |logit|), of its own pick. Default: 2^-5 in bf16/fp16, 1e-4 in fp32.",
    ),
    strict: bool = typer.Option(
        False, "--strict", metavar=FLAG, help="Exit 1 on any output not bitwise identical (ties too)."
    ),
    dtype: str = typer.Option(
        DEFAULTS.dtype,
        "--dtype",
        help="auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32. fp32 on CPU makes the identity exact: "
        "with --strict, the check that admits no near-tie.",
    ),
    drafter: str = typer.Option(
        DEFAULTS.drafter,
        "--drafter",
        help="What proposes the blocks: dflash (the exported drafter) | ngram (prompt lookup, vLLM's `ngram`).",
    ),
    baseline: bool = typer.Option(
        DEFAULTS.baseline,
        "--baseline/--no-baseline",
        metavar=FLAG,
        help="Prompt lookup beside the drafter on the same prompts (with --drafter dflash).",
        show_default=False,
    ),
    ngram_k: int | None = typer.Option(
        None,
        "--ngram-k",
        help="Tokens prompt lookup proposes per block (default: the drafter's block - 1, else 15).",
    ),
    ngram_min: int = typer.Option(
        DEFAULTS.ngram_min, "--ngram-min", help="Prompt lookup: shortest n-gram matched."
    ),
    ngram_max: int = typer.Option(
        DEFAULTS.ngram_max, "--ngram-max", help="Prompt lookup: longest n-gram matched."
    ),
    json_out: bool = JsonOption,
) -> None:
    """Decode prompts with the target alone and with the drafter proposing blocks; compare."""
    request = EvalRequest(
        export, config, target, prompts, num_prompts, prompt_len, max_new_tokens, device, tuple(overrides),
        tie_tolerance, dtype, drafter, baseline, ngram_k, ngram_min, ngram_max,
    )  # fmt: skip
    request.check()  # bad options: exit 2 before torch is imported
    from trainer.api import format_report, run_eval

    progress = Progress(
        TextColumn("[bold]decoding"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        console=make_console(stderr=True), disable=not sys.stderr.isatty(),
    )  # fmt: skip
    task = progress.add_task("eval", total=None)
    with progress:
        report = run_eval(
            request,
            on_prompt=lambda done: progress.update(task, completed=done),
            on_start=lambda total: progress.update(task, total=total),
        )
    typer.echo(json.dumps(report.to_json(), indent=2) if json_out else format_report(report))
    raise typer.Exit(report.exit_code(strict))


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)
