"""`dflash-doctor why PACKAGE`: what needs this package's libraries, and what breaks without it."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.markup import escape

from dflash_doctor.commands.options import JsonOption, PythonOption
from dflash_doctor.console import make_console
from dflash_doctor.env.environment import Environment
from dflash_doctor.libs.why import PackageExplanation, explain_package


def render_explanation(expl: PackageExplanation, console: Console) -> None:
    mark = "[bold red]![/]" if expl.load_bearing else "[green]✓[/]"
    console.print(f"[bold]{escape(expl.name)} {escape(expl.version)}[/]")
    console.print(f" {mark} {escape(expl.verdict)}")
    if expl.required_by:
        console.print("   required by:")
        for line in expl.required_by:
            console.print(f"     {escape(line)}")
    unused = [lib.soname for lib in expl.libraries if not lib.needed_by]
    for lib in expl.libraries:
        if not lib.needed_by:
            continue
        console.print(f"   [cyan]{escape(lib.soname)}[/]  {escape(lib.path)}")
        console.print(f"     needed by: {escape(', '.join(lib.needed_by))}")
        if lib.loaded_copy:
            console.print(f"     [yellow]the process loads another copy:[/] {escape(lib.loaded_copy)}")
        if lib.other_owners:
            console.print(f"     [yellow]also claimed by:[/] {escape(', '.join(lib.other_owners))}")
        fallback = "nothing: it resolves nowhere" if lib.without == "missing" else lib.without
        console.print(f"     without it: {escape(fallback)} ({escape(lib.without_via)})")
    if unused:
        console.print(
            f"   {len(unused)} more not linked by anything torch loads (the libraries above may "
            f"dlopen them at run time): {escape(', '.join(unused))}"
        )


def why_command(
    package: str = typer.Argument(..., help="A distribution name as pip shows it, e.g. nvidia-cudnn-cu13."),
    python: str | None = PythonOption,
    json_out: bool = JsonOption,
) -> None:
    """Which libraries PACKAGE provides, who needs them, and what happens without it."""
    env = Environment.load(python)
    expl = explain_package(env, package)
    env.save_parse_cache()
    if json_out:
        typer.echo(json.dumps(expl.to_json(), indent=2))
    else:
        render_explanation(expl, make_console())
    raise typer.Exit(0)


def register(app: typer.Typer) -> None:
    app.command("why")(why_command)
