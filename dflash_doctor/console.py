"""The consoles people read (rich): the one place that decides how wide they are.

rich cuts every line it prints at the console's width, and when the output is not a terminal (a CI
log, a pipe, a file) it assumes 80 columns: an error, a path or a command printed there comes out cut
into pieces, and a command copied from the log breaks. So off a terminal the width is `COLUMNS` when
set, else OFF_TERMINAL_WIDTH, wider than any line we print: every line comes out whole. On a terminal
rich takes the terminal's width (tables fit the screen); remedies, commands and errors are printed with
soft wrap there too (the terminal folds them, nothing is cut into separate lines).

rich is imported when a console is made, never at import: `check --json` does not load it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

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
    return console
