"""Stop signals (Ctrl-C, `kill`, a scheduler's SIGTERM, a closed terminal's SIGHUP) as one exception.

Python turns only SIGINT into an exception (KeyboardInterrupt, with a traceback); SIGTERM and SIGHUP kill
the process outright, skipping every `finally`. The launcher and the trainer's ranks both need the same
thing instead: unwind, close what they hold, say in one line how they ended and exit 128+signal. Torch-free,
so a rank installs it before its first heavy import.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

Handler = Callable[[int, FrameType | None], object]


class Stopped(BaseException):
    """A stop signal arrived; `signum` says which. A BaseException, like KeyboardInterrupt: an
    `except Exception` on the way up must not swallow it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal_name(signum)}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def stop_this_process(grace_s: float) -> None:
    """From a watching thread, when what this process serves is gone (its parent, its launcher's link):
    SIGTERM to itself (the stop handlers unwind the main thread, `finally` blocks run), then `os._exit` after
    `grace_s` if the main thread is stuck in a call that never returns to Python."""
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    os._exit(128 + signal.SIGTERM)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def raise_stopped(signum: int, _frame: FrameType | None) -> None:
    """The first stop signal raises; later ones are ignored, so the unwinding it starts (a rank writing
    its summary, the launcher closing its record) is not cut short by the next one. torchrun and `train`
    both signal a rank, so two arrive within milliseconds; whoever sent them kills after a grace period."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise Stopped(signum)


@contextmanager
def handling_stop_signals(handler: Handler = raise_stopped) -> Iterator[None]:
    """Route every stop signal to `handler` inside the block; the previous handlers come back after."""
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def install_stop_handlers() -> None:
    """For a process that stops only by exiting (a trainer rank): every stop signal raises Stopped."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, raise_stopped)
