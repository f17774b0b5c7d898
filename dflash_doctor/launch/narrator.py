"""What the launcher says while a run goes on: one line at a time on its console, soft-wrapped (a command or a
path pastes whole), and a spinner that animates only on a terminal."""

from __future__ import annotations

from contextlib import AbstractContextManager

from rich.console import Console


class Narrator:
    """`say(markup)` prints one line; `say.status(text)` shows a spinner for the length of a block."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def __call__(self, markup: str) -> None:
        self.console.print(markup, soft_wrap=True)

    def status(self, text: str) -> AbstractContextManager[object]:
        return self.console.status(text, spinner="dots")
