"""What the launcher says while a run goes on: one line at a time on its console, soft-wrapped (a command or a
path pastes whole), and a spinner that animates only on a terminal.

A closed pipe must not end the launcher. Ctrl-C on `dflash-doctor train ... | tee log` signals the whole
process group: `tee` dies at once, and the launcher's next line ("stopping the run") meets a pipe with no
reader. rich answers that by sending stdout to /dev/null and raising SystemExit(1), which would end the
launcher before it has stopped the workers and written the record (recorded `failed · exit None`). Here the
launcher goes on, and says the rest on stderr, which is still the terminal."""

from __future__ import annotations

from contextlib import AbstractContextManager

from rich.console import Console

from dflash_doctor.console import make_console


class Narrator:
    """`say(markup)` prints one line; `say.status(text)` shows a spinner for the length of a block."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def __call__(self, markup: str) -> None:
        try:
            self.console.print(markup, soft_wrap=True)
        except SystemExit:
            if not self.console.quiet:  # rich's Console.on_broken_pipe sets quiet before it raises
                raise  # an exit someone asked for, not a closed pipe
            if not self.console.stderr:
                self.console = make_console(stderr=True)
                self(markup)
            # stderr closed too: nobody reads any more; the record still says how the run ended

    def status(self, text: str) -> AbstractContextManager[object]:
        return self.console.status(text, spinner="dots")
