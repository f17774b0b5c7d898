"""Progress where no bar is drawn (a pipe, a log): a plain line each time the work moves, and at least every
EVERY_S seconds while it does not, so a log shows the command is alive and how far it is.

rich draws its bar on a terminal only: `data regenerate` on CPU with the default 1024 new tokens printed
nothing for 11 minutes into a pipe (its first chunk of 64 conversations had not finished).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

EVERY_S = 30.0


class ProgressLines:
    """`with ProgressLines(describe, write): ... lines.moved()`: `write(describe())` on every `moved()` and
    after EVERY_S seconds without one; a thread keeps the time, the lines never interleave."""

    def __init__(
        self,
        describe: Callable[[], str],
        write: Callable[[str], None],
        every_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.describe, self.write, self.clock = describe, write, clock
        self.every_s = EVERY_S if every_s is None else every_s
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._last = clock()
        self._thread = threading.Thread(target=self._beat, name="progress-lines", daemon=True)

    def moved(self) -> None:
        """The work moved: say so now (the next quiet-time line is EVERY_S from here)."""
        with self._lock:
            self.write(self.describe())
            self._last = self.clock()

    def _beat(self) -> None:
        while not self._done.wait(max(0.0, self._last + self.every_s - self.clock())):
            with self._lock:
                if self.clock() - self._last >= self.every_s:
                    self.write(self.describe())
                    self._last = self.clock()

    def __enter__(self) -> ProgressLines:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._done.set()
        self._thread.join(timeout=5)


def elapsed_text(seconds: float) -> str:
    """`45 s`, `3m10s`, `1h02m`."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def regenerate_estimate(written: int, seconds: float, todo: int) -> str | None:
    """After the first commit: the conversations left times the seconds each took so far, said once so that a
    CPU user learns in a minute that the whole set is hours (was: `0/12459 0 tok/s` for minutes, issue 39 U2)."""
    left = todo - written
    if written <= 0 or seconds <= 0 or left <= 0:
        return None
    each = seconds / written
    return (
        f"estimate: {left:,} conversations left x {each:,.1f} s each (the pace of the {written:,} written so far "
        f"on this device) = about {elapsed_text(left * each)}; --limit N answers fewer"
    )


class RegenerateProgress:
    """`data regenerate`'s progress: a bar in a terminal (conversations, generated tokens and tok/s, time
    left), else `ProgressLines` (a line per chunk written and at least every EVERY_S seconds). `show(summary,
    todo)` is the job's `on_progress`: its first call only counts the work, each later one follows a written
    chunk (the first of them also prints the time estimate). `tokens(summary)` is its `on_tokens`: the tokens
    counted while a chunk is answered, so neither the bar nor the lines sit at 0 until a chunk ends."""

    def __init__(self, console: Any, quiet: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.began = time.monotonic()
        self.summary: Any = None
        self.todo = 0
        self.bar = Progress(
            TextColumn("regenerating"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
            TimeRemainingColumn(), console=console, disable=quiet or not console.is_terminal,
        )  # fmt: skip
        self.task = self.bar.add_task("", total=None, rate="")
        self.console, self.quiet, self.estimated = console, quiet, False
        write = lambda line: console.print(line, soft_wrap=True)  # noqa: E731
        self.lines = None if console.is_terminal else ProgressLines(self.describe, write)

    @staticmethod
    def _tokens(summary: Any) -> int:
        return int(getattr(summary, "tokens_so_far", summary.generated_tokens))

    @classmethod
    def _rate(cls, summary: Any) -> float:
        return float(cls._tokens(summary) / summary.seconds) if summary.seconds else 0.0

    def _rate_text(self, summary: Any) -> str:
        return f"{self._tokens(summary):,} tokens, {self._rate(summary):,.0f} tok/s"

    def show(self, summary: Any, todo: int) -> None:
        self.bar.update(self.task, total=todo, completed=summary.written, rate=self._rate_text(summary))
        first = self.summary is None
        self.summary, self.todo = summary, todo
        if not first and not self.estimated and not self.quiet:
            self.estimated = True
            line = regenerate_estimate(summary.written, summary.seconds, todo)
            if line is not None:
                self.console.print(line, soft_wrap=True)
        if self.lines is not None and not first:
            self.lines.moved()

    def tokens(self, summary: Any) -> None:
        """Tokens made for the chunk in flight: the bar's count and rate move (a pipe's next line says them)."""
        self.summary = summary
        self.bar.update(self.task, rate=self._rate_text(summary))

    def describe(self) -> str:
        when = elapsed_text(time.monotonic() - self.began)
        s = self.summary
        if s is None:
            return f"regenerating: reading the input and loading the target, {when} in"
        return (
            f"regenerating: {s.written:,} of {self.todo:,} conversations written, {s.answers:,} answers, "
            f"{self._tokens(s):,} tokens ({self._rate(s):,.0f} tok/s), {when} in"
        )

    def __enter__(self) -> RegenerateProgress:
        self.bar.__enter__()
        if self.lines is not None:
            self.lines.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self.lines is not None:
            self.lines.__exit__(kind, error, trace)
        self.bar.__exit__(kind, error, trace)
