"""Work run in a thread beside the launcher's own, and never left behind: stopped and joined on the way out.

The gate's deep probe is a child process that imports torch and initialises CUDA (22.5 s of a cold
qwen3-8b-b16 launch on an H200, issue 40 §2) while the static checks, which never need it, take seconds of
their own: the two run side by side, and only the checks that judge the probe's report wait for it. The
function gets a `threading.Event`; a child it starts through `processes.run_child(cancel=...)` is stopped when
the launcher gives up (a stop signal, a crash of our own) instead of outliving it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

T = TypeVar("T")
POLL_S = 0.2  # the wait for the result wakes this often, so a stop signal is handled in the main thread


class Beside(Generic[T]):
    """`fn(cancel)` in a daemon thread; `result()` waits for it (re-raising its exception), `stop()` cancels
    what is still running and joins. `seconds`: how long `fn` ran."""

    def __init__(self, fn: Callable[[threading.Event], T], name: str) -> None:
        self.fn = fn
        self.cancel = threading.Event()
        self.future: Future[T] = Future()
        self.seconds: float | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        began = time.perf_counter()
        try:
            self.future.set_result(self.fn(self.cancel))
        except BaseException as exc:
            self.future.set_exception(exc)
        finally:
            self.seconds = time.perf_counter() - began

    def start(self) -> Beside[T]:
        self.thread.start()
        return self

    def result(self) -> T:
        while True:
            try:
                return self.future.result(timeout=POLL_S)
            except TimeoutError:
                continue

    def stop(self) -> None:
        """Cancel what still runs (no-op once done) and wait for the thread: nothing outlives the caller."""
        if not self.future.done():
            self.cancel.set()
        self.thread.join()
