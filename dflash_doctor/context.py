"""What every check receives: the audited environment, the options of this run, and shared analyses.

Checks must not recompute expensive analyses (ELF resolution, hashing) on their own: they ask the
context with `ctx.shared(name, factory)` and get the one result computed for this run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:  # types only: the core imports nothing above it
    from dflash_doctor.env.environment import Environment
    from trainer.runspec.config import TrainConfig

T = TypeVar("T")


class Cancellable(Protocol):
    def cancel(self) -> None: ...


@dataclass
class CheckOptions:
    """Switches that decide which checks run and what they compare against."""

    deep: bool = False
    lock_path: Path | None = None
    config_path: Path | None = None
    config: TrainConfig | None = None  # a validated trainer config, when checks run for a launch
    strict: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckContext:
    env: Environment
    options: CheckOptions = field(default_factory=CheckOptions)
    _shared: dict[str, Any] = field(default_factory=dict, repr=False)
    _started: dict[str, Cancellable] = field(default_factory=dict, repr=False)
    # seconds each `start(name)` took in this process (reading what the work needs, starting its helpers):
    # time no check's own figure shows (`check --json`'s context)
    start_seconds: dict[str, float] = field(default_factory=dict, repr=False)
    # seconds of the run's other phases, by name (`check`: reading the environment, saving the parse cache)
    phase_seconds: dict[str, float] = field(default_factory=dict, repr=False)

    def shared(self, name: str, factory: Callable[[], T]) -> T:
        """Compute an analysis once per run and hand the same object to every check that asks."""
        if name not in self._shared:
            self._shared[name] = factory()
        value = self._shared[name]
        if isinstance(value, _Pending):  # computed elsewhere (a thread beside the checks): wait for it once
            value = self._shared[name] = value.get()
        result: T = value
        return result

    def start(self, name: str, starter: Callable[[], Cancellable | None]) -> None:
        """Start work beside the checks once per run (forked children); `started(name)` hands it over. A
        starter that finds nothing to do returns None."""
        if name in self._started:
            return
        began = time.perf_counter()
        try:
            work = starter()
        finally:
            self.start_seconds[name] = self.start_seconds.get(name, 0.0) + time.perf_counter() - began
        if work is not None:
            self._started[name] = work

    def started(self, name: str) -> Any | None:
        """The work `start(name)` began, handed over once (the taker collects it), or None when nothing
        started it or it was taken already: the caller then does the work itself."""
        return self._started.pop(name, None)

    def close(self) -> None:
        """Cancel what was started and never taken (its check did not run, or crashed first)."""
        while self._started:
            _, work = self._started.popitem()
            work.cancel()

    def pending(self, name: str, get: Callable[[], Any]) -> None:
        """`shared(name)` will be `get()`, called by the first check that asks (it may wait for a thread)."""
        self._shared[name] = _Pending(get)


@dataclass(frozen=True)
class _Pending:
    get: Callable[[], Any]
