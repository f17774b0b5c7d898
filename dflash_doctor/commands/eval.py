"""`dflash-doctor eval --export DIR --config RUN.toml`: real greedy speculative decoding with the drafter.

Exit codes: 0 every emitted token is the target's choice, exactly or up to a near-tie (bf16 rounding: the
report counts them), and every output equals target-only greedy decoding's up to such flips; 1 a token the
target did not choose (a bug to report), or, with --strict, any output not bitwise identical; 2 bad usage, a
bad config, export, prompts file or tolerance.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from dflash_base.errors import ConfigError
from dflash_doctor.commands.options import FLAG, JsonOption, OptionalConfigOption, SetOption
from dflash_doctor.console import make_console
from trainer.runspec.eval_request import (
    DEFAULT_NGRAM_K,
    DEFAULTS,
    HELDOUT_PROMPTS,
    TIE_ULPS_FP32,
    TIE_ULPS_LOW_PRECISION,
    EvalRequest,
)

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
NumPromptsOption = Annotated[
    int | None,
    typer.Option(
        "--num-prompts",
        help=f"Prompts to decode, the first N (default: every prompt of --prompts; {HELDOUT_PROMPTS} held-out ones).",
    ),
]
PromptLenOption = Annotated[
    int, typer.Option("--prompt-len", help="Held-out prompts: the tokens of each kept.")
]
MaxNewTokensOption = Annotated[int, typer.Option("--max-new-tokens", help="New tokens per prompt, at most.")]
DeviceOption = Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N")]
TieUlpsOption = Annotated[
    int | None,
    typer.Option(
        "--tie-ulps",
        help="A token that is not the target's top choice counts as a near-tie (exit 0) when its logit is within "
        f"this many ulps of the top logit, in the compute dtype. Default: {TIE_ULPS_LOW_PRECISION} in bf16/fp16, "
        f"{TIE_ULPS_FP32} in fp32; 0 accepts only exact ties.",
    ),
]
EngineOption = Annotated[
    str,
    typer.Option(
        "--engine",
        help="kv (a static KV cache, every prompt batched, CUDA graphs) | loop (one prompt at a time, the "
        "reference) | auto (kv where the target is one the engine serves).",
    ),
]
LatencyOption = Annotated[
    str | None,
    typer.Option(
        "--latency",
        help="Batch sizes to time, comma-separated (default on a GPU: 1,8,32; on a CPU none). '' for none.",
    ),
]
LatencyPromptsOption = Annotated[
    int, typer.Option("--latency-prompts", help="Requests each latency row decodes (the first N prompts).")
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
        help=f"Tokens prompt lookup proposes per block (default: the drafter's block - 1, else {DEFAULT_NGRAM_K}).",
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
    tie_ulps: TieUlpsOption = None,
    strict: StrictOption = False,
    dtype: DtypeOption = DEFAULTS.dtype,
    drafter: DrafterOption = DEFAULTS.drafter,
    baseline: BaselineOption = DEFAULTS.baseline,
    ngram_k: NgramKOption = None,
    ngram_min: NgramMinOption = DEFAULTS.ngram_min,
    ngram_max: NgramMaxOption = DEFAULTS.ngram_max,
    engine: EngineOption = DEFAULTS.engine,
    latency: LatencyOption = None,
    latency_prompts: LatencyPromptsOption = DEFAULTS.latency_prompts,
    json_out: bool = JsonOption,
) -> None:
    """Decode prompts with the target alone, with the drafter proposing blocks and with prompt lookup; compare."""
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
        tie_ulps=tie_ulps,
        dtype=dtype,
        drafter=drafter,
        baseline=baseline,
        ngram_k=ngram_k,
        ngram_min=ngram_min,
        ngram_max=ngram_max,
        engine=engine,
        latency=batch_sizes(latency),
        latency_prompts=latency_prompts,
    )
    request.check()  # bad options: exit 2 before torch is imported
    from trainer.api import format_report

    report = _run_with_progress(request)
    typer.echo(json.dumps(report.to_json(), indent=2) if json_out else format_report(report))
    raise typer.Exit(report.exit_code(strict))


def batch_sizes(text: str | None) -> tuple[int, ...] | None:
    """--latency "1,8,32" as sizes; None when not given (the device's default), () for ''."""
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.replace(" ", "").split(",") if part)
    except ValueError:
        raise ConfigError(
            f"--latency: {text!r} is not a list of batch sizes", hint="e.g. --latency 1,8,32"
        ) from None


def _run_with_progress(request: EvalRequest) -> EvalReport:
    """The eval, with a progress bar on stderr when it is a terminal (tokens decoded on the engine, prompts in the
    loop), and a line every ten seconds otherwise, so a long CPU eval shows a sign of life."""
    import time

    from trainer.api import run_eval

    console = make_console(stderr=True)
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        console=console, disable=not sys.stderr.isatty(),
    )  # fmt: skip
    task = progress.add_task("decoding", total=None)
    last = [time.monotonic()]

    def moved(phase: str, done: int, total: int) -> None:
        progress.update(task, description=f"decoding ({phase})", completed=done, total=total)
        if not sys.stderr.isatty() and time.monotonic() - last[0] >= 10:
            last[0] = time.monotonic()
            print(f"eval: decoding ({phase}), {done:,} of at most {total:,}", file=sys.stderr, flush=True)

    with progress:
        return run_eval(request, on_progress=moved)


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)
