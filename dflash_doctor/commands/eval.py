"""`dflash-doctor eval --export DIR --config RUN.toml`: real greedy speculative decoding with the drafter.

Exit codes: 0 every prompt's speculative output equals target-only greedy decoding's, bitwise or up to a
near-tie flip (bf16 rounding: the report names each); 1 an output really differs (a bug to report), or, with
--strict, any output is not bitwise identical; 2 bad usage, a bad config, export, prompts file or tolerance.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from dflash_doctor.commands.options import FLAG, JsonOption, OptionalConfigOption, SetOption
from dflash_doctor.console import make_console
from trainer.runspec.eval_request import DEFAULTS, EvalRequest

if TYPE_CHECKING:
    from trainer.api import EvalReport


# The options, one type each: the command's signature then reads one line per option.
ExportOption = Annotated[
    str | None,
    typer.Option(
        "--export", help="The drafter's export folder (config.json + safetensors); not for --drafter ngram."
    ),
]
TargetOption = Annotated[
    str | None, typer.Option("--target", help="The target (default: the config's target.path).")
]
PromptsOption = Annotated[
    str | None,
    typer.Option("--prompts", help='A JSONL of {"prompt"}, {"messages"} or {"input_ids"} records.'),
]
NumPromptsOption = Annotated[int, typer.Option("--num-prompts", help="Prompts to decode (the first N).")]
PromptLenOption = Annotated[
    int, typer.Option("--prompt-len", help="Held-out prompts: the tokens of each kept.")
]
MaxNewTokensOption = Annotated[int, typer.Option("--max-new-tokens", help="New tokens per prompt.")]
DeviceOption = Annotated[str, typer.Option("--device", help="auto | cpu | cuda")]
TieToleranceOption = Annotated[
    float | None,
    typer.Option(
        "--tie-tolerance",
        help="A first difference counts as a near-tie flip (exit 0) when each decode rates the other's token "
        "within this many logits, times max(1, |logit|), of its own pick. Default: 2^-5 in bf16/fp16, 1e-4 in fp32.",
    ),
]
StrictOption = Annotated[
    bool,
    typer.Option("--strict", metavar=FLAG, help="Exit 1 on any output not bitwise identical (ties too)."),
]
DtypeOption = Annotated[
    str,
    typer.Option(
        "--dtype",
        help="auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32. fp32 on CPU makes the identity exact: "
        "with --strict, the check that admits no near-tie.",
    ),
]
DrafterOption = Annotated[
    str,
    typer.Option(
        "--drafter",
        help="What proposes the blocks: dflash (the exported drafter) | ngram (prompt lookup, vLLM's `ngram`).",
    ),
]
BaselineOption = Annotated[
    bool,
    typer.Option(
        "--baseline/--no-baseline",
        metavar=FLAG,
        help="Prompt lookup beside the drafter on the same prompts (with --drafter dflash).",
        show_default=False,
    ),
]
NgramKOption = Annotated[
    int | None,
    typer.Option(
        "--ngram-k",
        help="Tokens prompt lookup proposes per block (default: the drafter's block - 1, else 15).",
    ),
]
NgramMinOption = Annotated[int, typer.Option("--ngram-min", help="Prompt lookup: shortest n-gram matched.")]
NgramMaxOption = Annotated[int, typer.Option("--ngram-max", help="Prompt lookup: longest n-gram matched.")]


def eval_command(
    export: ExportOption = None,
    config: OptionalConfigOption = None,
    target: TargetOption = None,
    prompts: PromptsOption = None,
    num_prompts: NumPromptsOption = DEFAULTS.num_prompts,
    prompt_len: PromptLenOption = DEFAULTS.prompt_len,
    max_new_tokens: MaxNewTokensOption = DEFAULTS.max_new_tokens,
    device: DeviceOption = DEFAULTS.device,
    overrides: SetOption = None,
    tie_tolerance: TieToleranceOption = None,
    strict: StrictOption = False,
    dtype: DtypeOption = DEFAULTS.dtype,
    drafter: DrafterOption = DEFAULTS.drafter,
    baseline: BaselineOption = DEFAULTS.baseline,
    ngram_k: NgramKOption = None,
    ngram_min: NgramMinOption = DEFAULTS.ngram_min,
    ngram_max: NgramMaxOption = DEFAULTS.ngram_max,
    json_out: bool = JsonOption,
) -> None:
    """Decode prompts with the target alone and with the drafter proposing blocks; compare."""
    request = EvalRequest(
        export=export,
        config=config,
        target=target,
        prompts=prompts,
        num_prompts=num_prompts,
        prompt_len=prompt_len,
        max_new_tokens=max_new_tokens,
        device=device,
        overrides=tuple(overrides or ()),
        tie_tolerance=tie_tolerance,
        dtype=dtype,
        drafter=drafter,
        baseline=baseline,
        ngram_k=ngram_k,
        ngram_min=ngram_min,
        ngram_max=ngram_max,
    )
    request.check()  # bad options: exit 2 before torch is imported
    from trainer.api import format_report

    report = _run_with_progress(request)
    typer.echo(json.dumps(report.to_json(), indent=2) if json_out else format_report(report))
    raise typer.Exit(report.exit_code(strict))


def _run_with_progress(request: EvalRequest) -> EvalReport:
    """The eval, with a progress bar on stderr when it is a terminal."""
    from trainer.api import run_eval

    progress = Progress(
        TextColumn("[bold]decoding"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        console=make_console(stderr=True), disable=not sys.stderr.isatty(),
    )  # fmt: skip
    task = progress.add_task("eval", total=None)
    with progress:
        return run_eval(
            request,
            on_prompt=lambda done: progress.update(task, completed=done),
            on_start=lambda total: progress.update(task, total=total),
        )


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)
