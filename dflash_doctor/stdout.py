"""Our stdout written whole, or a named error: `check --json > /dev/full` or to a full disk never exits 0.

On a full disk the kernel takes part of a write (16384 of 40000 bytes) and refuses the rest; Python's
buffered stdout then drops the rest without a word: `check --json` to a file on a full disk exited 0 with
its JSON cut at 8 kB. `checked_stdout()` puts a stdout in its place, for one command, whose every write is
retried until it is whole or fails, and whose failure is an OSError naming `stdout` (the CLI boundary turns
it into exit 2). After a failure it drops what is left, so interpreter shutdown has nothing to fail on.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Buffer

NAME = "stdout"  # the OSError's filename: what the CLI's message names


class WholeWrites(io.RawIOBase):
    """File descriptor `fd`, each write written whole (short writes retried) or an OSError naming stdout."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd
        self.broken = False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:
        return os.isatty(self.fd)

    def write(self, data: Buffer, /) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        if self.broken:
            return size  # already reported: the rest goes nowhere
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as exc:
            self.broken = True
            raise OSError(exc.errno, exc.strerror, NAME) from exc
        return size


@contextlib.contextmanager
def checked_stdout() -> Iterator[None]:
    """Within: `sys.stdout` writes whole or raises an OSError named `stdout`; flushed before it ends.

    Only the process's real stdout is replaced (a test's captured stdout, a redirect inside Python, stay)."""
    original = sys.stdout
    try:
        real = original is sys.__stdout__ and original is not None and original.fileno() >= 0
    except (AttributeError, OSError, ValueError):
        real = False
    if not real:
        yield
        return
    original.flush()
    checked = io.TextIOWrapper(
        io.BufferedWriter(WholeWrites(original.fileno())),
        encoding=original.encoding,
        errors=original.errors,
        line_buffering=bool(original.line_buffering),
    )
    sys.stdout = checked
    try:
        yield
    except SystemExit:  # a command's normal end (typer.Exit): what it printed must have gone out
        checked.flush()
        raise
    else:
        checked.flush()
    finally:
        sys.stdout = original
        with contextlib.suppress(OSError, ValueError):
            checked.flush()  # after a failure: dropped quietly (reported once already)
        checked.detach()
