"""The consoles people read (rich): the one place that decides how wide they are.

rich cuts every line it prints at the console's width, and when the output is not a terminal (a CI
log, a pipe, a file) it assumes 80 columns: an error, a path or a command printed there comes out cut
into pieces, and a command copied from the log breaks. So off a terminal the width is `COLUMNS` when
set, else OFF_TERMINAL_WIDTH, wider than any line we print: every line comes out whole. On a terminal
rich takes the terminal's width (tables fit the screen); remedies, commands and errors are printed with
soft wrap there too (the terminal folds them, nothing is cut into separate lines).

rich pads every row of a table to the table's width, so off a terminal a 68-character line came out padded
to 179 with blanks (`check` to 206-330 columns, `--help` to 80). `NoTrailingBlanks` drops the blanks at the
end of each line of text that is not going to a terminal: consoles made here write through it, and the CLI
wraps stdout and stderr in it for the length of a command (`plain_pipes`), so typer's own `--help` and
`typer.echo` come out without them too.

rich is imported when a console is made, never at import: `check --json` does not load it.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

OFF_TERMINAL_WIDTH = 10_000  # wider than any line we print; tables are never expanded to the width


def off_terminal_width(environ: Mapping[str, str] = os.environ) -> int:
    """The width for output that is not a terminal: `COLUMNS` when it is a positive number, else wide."""
    columns = environ.get("COLUMNS", "").strip()
    return int(columns) if columns.isdigit() and int(columns) > 0 else OFF_TERMINAL_WIDTH


def make_console(stderr: bool = False, **options: Any) -> Console:
    """A rich console on stdout (or stderr) that never cuts a line at 80 columns in a pipe or a log.

    `options` go to rich's Console (e.g. `soft_wrap=True`); highlighting is off (it would colour
    numbers and paths at random)."""
    from rich.console import Console

    console = Console(stderr=stderr, highlight=False, **options)
    if not console.is_terminal and not console.is_jupyter:
        console.width = off_terminal_width()
        if not isinstance(console.file, NoTrailingBlanks):
            console.file = NoTrailingBlanks(console.file)  # type: ignore[assignment]
    return console


BLANKS_BEFORE_NEWLINE = re.compile(r"[ \t]+(?=\r?\n)")


class NoTrailingBlanks:
    """A text stream that writes what it is given minus the blanks that end a line. Blanks at the very end
    of a write are held back until the next write shows whether a line ends after them."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self._held = ""

    def write(self, text: str) -> int:
        joined = self._held + text
        body = joined.rstrip(" \t")
        self._held = joined[len(body) :]
        self.stream.write(BLANKS_BEFORE_NEWLINE.sub("", body))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, buffer, ...: the stream's own
        return getattr(self.stream, name)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def plain_pipes() -> Iterator[None]:
    """For one command: stdout and stderr, where they are not a terminal, without blanks ending a line."""
    saved = sys.stdout, sys.stderr
    if sys.stdout is not None and not _is_terminal(sys.stdout):
        sys.stdout = NoTrailingBlanks(sys.stdout)
    if sys.stderr is not None and not _is_terminal(sys.stderr):
        sys.stderr = NoTrailingBlanks(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
