"""The `dflash-doctor` command line. Each command lives in `dflash_doctor/commands/<name>.py` and
registers itself with `register(app)`; this module only assembles them.

Exit codes: 0 healthy, 1 a failing finding (or a failed run), 2 bad usage / bad input / bad config,
3 a bug in dflash-doctor, 128+N a run stopped by signal N.

`run` is the one error boundary every command shares, so the next command added keeps the same rules:
a DoctorError is its message and exit 2; an OSError that escaped (a read-only home, a full disk) names the
file and the reason, exit 2, and so does a stdout that could not take the output (`/dev/full`, a full disk:
`stdout.py`); anything else is a bug: one line asking for a report, the traceback only
with `-v` (or DFLASH_DOCTOR_DEBUG=1).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import pkgutil
import sys
import threading
from collections.abc import Iterator

import typer

from dflash_base.errors import DoctorError
from dflash_base.stopping import Stopped, handling_stop_signals
from dflash_doctor import __version__
from dflash_doctor.console import make_console, plain_pipes
from dflash_doctor.paths import HOME_ENV
from dflash_doctor.stdout import NAME as STDOUT
from dflash_doctor.stdout import checked_stdout

app = typer.Typer(
    name="dflash-doctor",
    help="Keep multi-GPU PyTorch training environments sound; train DFlash drafters behind a gate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="rich",
)


DEBUG_ENV = "DFLASH_DOCTOR_DEBUG"
BUG_EXIT_CODE = 3


def _version(value: bool) -> None:
    if value:
        typer.echo(f"dflash-doctor {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, metavar="", help="Print the version."
    ),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", metavar="", help="On an internal error, print the full traceback."
    ),
) -> None:
    """dflash-doctor: verdicts with evidence and exact remedies for your training environment."""


_REGISTERED: set[str] = set()


def _command_modules() -> list[str]:
    from dflash_doctor import commands

    return sorted(m.name for m in pkgutil.iter_modules(commands.__path__))


def _register(names: list[str]) -> None:
    """Import command modules (each registers itself once); a module is named after its command."""
    for name in names:
        if name in _REGISTERED:
            continue
        mod = importlib.import_module(f"dflash_doctor.commands.{name}")
        register = getattr(mod, "register", None)
        if register is not None:
            register(app)
        _REGISTERED.add(name)


def reflowed(doc: str) -> str:
    """A docstring as help: each paragraph's hard-wrapped lines joined, so the terminal wraps it at its own
    width (issue 58: rich kept the source's line breaks after the first paragraph, "Exit 1 when the" then
    "probe could not run" on the next line); a paragraph of list items or indented lines is kept as written."""
    lines = doc.expandtabs().splitlines() or [""]
    rest = lines[1:]
    margin = min((len(line) - len(line.lstrip()) for line in rest if line.strip()), default=0)
    clean = "\n".join([lines[0].strip(), *(line[margin:].rstrip() for line in rest)]).strip()
    paragraphs = [p for p in clean.split("\n\n") if p.strip()]  # as inspect.cleandoc, without its import
    kept = []
    for paragraph in paragraphs:
        lines = paragraph.splitlines()
        listed = any(
            line.startswith((" ", "-", "*", "|")) or line[:2].rstrip(".").isdigit() for line in lines
        )
        kept.append(paragraph if listed else " ".join(line.strip() for line in lines))
    return "\n\n".join(kept)


def _reflow_help(group: typer.Typer) -> None:
    """Every command's help from its docstring, reflowed (`reflowed`), unless it was given as `help=`."""
    for command in group.registered_commands:
        if command.help is None and command.callback is not None and command.callback.__doc__:
            command.help = reflowed(command.callback.__doc__)
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _reflow_help(sub.typer_instance)


def _command_word(argv: list[str]) -> str | None:
    """The first word that is not an option: the command's name, when the command line names one."""
    words = [a for a in argv if not a.startswith("-")]
    return words[0] if words else None


def _register_for(argv: list[str]) -> None:
    """Only the module of the command being run: `check` must not pay for importing `train` and `cache`.
    Anything else (no command, --help, a typo) registers every command, so help and errors list them all."""
    word = _command_word(argv)
    word = word.replace("-", "_") if word else word  # `serve-check` lives in commands/serve_check.py
    modules = _command_modules()
    if word in modules:
        _register([word])
    else:
        _register(modules)
    _reflow_help(app)


ERROR_SCHEMA = "dflash-doctor/error/v1"


def _print_error(message: str, hint: str | None = None, json_code: int | None = None) -> None:
    """The error on stderr, as a person reads it; with `json_code` (the command ran with --json) also one JSON
    document on stdout, `{"schema", "error", "hint", "exit_code"}`, so a program reading stdout gets JSON
    whatever happened (issue 58, N13: errors under --json were plain text only)."""
    from rich.markup import escape

    err = make_console(stderr=True, soft_wrap=True)  # rich loaded only on this path
    err.print(f"[bold red]error:[/] {escape(message)}")
    if hint:
        err.print(f"  [cyan]hint:[/] {escape(hint)}")
    if json_code is not None:
        import json

        document = {"schema": ERROR_SCHEMA, "error": message, "hint": hint, "exit_code": json_code}
        with contextlib.suppress(OSError, ValueError):
            print(json.dumps(document), flush=True)


def _json_code(args: list[str], code: int) -> int | None:
    """`code` when the command was asked for --json (before any `--`), else None."""
    asked = "--json" in (args[: args.index("--")] if "--" in args else args)
    return code if asked else None


@contextlib.contextmanager
def _stop_signals_unwind() -> Iterator[None]:
    """Ctrl-C, SIGTERM or SIGHUP anywhere in a command: unwind (finally blocks run), exit 128+signal."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may install handlers (tests call `run` from threads)
        return
    with handling_stop_signals():
        yield


def _wants_traceback(args: list[str]) -> bool:
    return bool(os.environ.get(DEBUG_ENV)) or any(a in ("-v", "--verbose") for a in args)


def os_error_message(exc: OSError) -> str:
    """`cannot write /x/y: Permission denied`: the file and the reason, never a traceback."""
    where = exc.filename if exc.filename is not None else "a file"
    reason = exc.strerror or str(exc)
    return f"{where}: {reason}"


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code: the one error boundary of every command (see the module doc)."""
    args = sys.argv[1:] if argv is None else argv
    _register_for(args)
    try:
        with _stop_signals_unwind(), checked_stdout(), plain_pipes():
            app(args=args, prog_name="dflash-doctor")
    except Stopped as stop:
        _print_error(f"{stop}; nothing more was done")
        return stop.exit_code
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except DoctorError as exc:
        _print_error(exc.message, exc.hint, _json_code(args, exc.exit_code))
        return exc.exit_code
    except OSError as exc:
        if exc.filename == STDOUT:
            _print_error(
                f"cannot write to {STDOUT}: {exc.strerror or exc}; what was printed is incomplete",
                hint="send the output where there is room: another disk, or a pipe that reads all of it",
            )
            return DoctorError.exit_code
        _print_error(
            os_error_message(exc),
            hint="check that the path is right, that it is a folder where a folder is expected, "
            f"and that you may write there (dflash-doctor's own state: ${HOME_ENV})",
            json_code=_json_code(args, DoctorError.exit_code),
        )
        return DoctorError.exit_code
    except Exception as exc:
        if _wants_traceback(args):
            import traceback

            traceback.print_exc()
        _print_error(
            f"internal error: {type(exc).__name__}: {exc}",
            hint="this is a bug in dflash-doctor; please report it with the output of "
            f"`{DEBUG_ENV}=1 dflash-doctor {' '.join(args)}` (it shows the traceback)",
        )
        return BUG_EXIT_CODE
    return 0


# Commands that leave nothing for interpreter shutdown to do (no threads, no children, no temp files,
# their output written): the process ends right after flushing, as mypy's does, instead of freeing every
# module and the parse cache's ~60k objects one by one (~30 ms of a ~300 ms `check`).
QUICK_EXIT = frozenset({"check"})


def main() -> None:
    args = sys.argv[1:]
    quick = _command_word(args) in QUICK_EXIT
    if quick:
        # No cyclic garbage to speak of (the same peak RSS either way), and ~24 ms of collector passes over
        # the parse cache's ~60k loaded tuples in a warm `check` of a 50k-file environment
        # (bench/check/check_speed.py, BENCHMARKS 4.9); the process ends in a second.
        gc.disable()
    code = run(args)
    if quick:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
