"""A rank never outlives its parent: torchrun, or the launcher that started a lone rank directly.

torchrun starts every rank in a session of its own, and `dflash-doctor train` starts a lone rank in one too
(dflash_doctor/launch/direct.py), so when that parent is killed outright (SIGKILL, the OOM killer) nothing
signals the ranks: they are re-parented to PID 1 and a rank blocked on a peer, or one that was hung, stays
asleep for ever (issue 18, row 17: found alive 57 minutes after a test). A daemon thread notices the new
parent within a second and sends this process SIGTERM (the stop handlers unwind it, `finally` blocks run); a
rank stuck in a blocking call that never returns to Python is ended after `grace_s` with `os._exit`.
"""

from __future__ import annotations

import os
import threading
import time

from dflash_base.stopping import stop_this_process

POLL_S = 1.0


def watch_parent(grace_s: float, poll_s: float = POLL_S) -> threading.Thread:
    """Start the watch for the current parent; returns the (daemon) thread."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        stop_this_process(grace_s)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread
