"""`dflash-doctor data preview --config RUN.toml`: the data exactly as the trainer will see it.

Exit codes: 0 shown; 2 a bad config or data file (the message names the field or the line).
"""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from dflash_doctor.commands.options import JsonOption

data_app = typer.Typer(help="Look at training data as the trainer sees it.")


def _sample_text(sample: dict[str, Any], supervised_style: str) -> Text:
    """The sample's real tokens (ids where there is no tokenizer); supervised ones highlighted, the rest dim."""
    real = sample["real_tokens"]
    pieces = sample["tokens"] or [f"{t} " for t in sample["input_ids"][:real]]
    text = Text()
    for piece, on in zip(pieces, sample["loss_mask"][:real], strict=True):
        text.append(piece, style=supervised_style if on else "dim")
    return text


@data_app.command("preview")
def preview_command(
    config: str = typer.Option(..., "--config", help="A training config (TOML) or a shipped config's name."),
    samples: int = typer.Option(3, "--samples", min=0, help="Records to show (the first N, in file order)."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config field: --set data.seq_len=256."),
    json_out: bool = JsonOption,
) -> None:
    """The first records tokenised, truncated and padded as in training (supervised tokens highlighted), and
    counts over the whole data: sequences, tokens, supervised share, truncated share."""
    from trainer.config import load_config
    from trainer.data_preview import preview

    cfg = load_config(config, overrides)
    result = preview(cfg, samples).to_json()
    if json_out:
        typer.echo(json.dumps(result))
        return
    console = Console(highlight=False)
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


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
