"""A lone rank is its own warm-up: started beside the gate, it compiles while the gate finishes, then waits.

The warm-up child exists so that workers never compile concurrently from a cold cache. A launch of one process
in all (`direct.py`) has no such race, yet it ran the child (imports, CUDA init, model build, compile) and
only then the rank, which imported and built the same model again: 12.8 s of a cold qwen3-8b-b16 launch's 68.0
s on a fresh H200 (BENCHMARKS 4.9, S15). So the launcher starts the rank itself where it would start the child
(once the checks the compile depends on passed, `gate.WARM_UP_NEEDS`), into the same managed cache folder.
The rank builds and compiles, reports over its link (`dflash_base/go_link.py`) and waits; it trains only on
the launcher's go, given once the whole gate passed (static checks, the deep probe) and the run is recorded.

What the rank may do before the go: import, build, read its data and `output.dir`'s checkpoints (the launcher
holds the folder's lock from the rank's start: `lifecycle.EarlyWarmUp`), compile. Never: a training step,
`metrics.jsonl`, a checkpoint, an export, a line on the terminal (its stderr is held here, its stdout in the
rank). A refusal closes the link and stops the rank's process tree; a launcher that dies closes the link too.
`DFLASH_DOCTOR_SEPARATE_WARM_UP=1` restores the separate warm-up child for a lone rank.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_base.go_link import GO_FD_ENV, LauncherLink
from dflash_doctor.launch.plan import LaunchPlan
from dflash_doctor.launch.supervise import Launched, launch_tree

SEPARATE_ENV = "DFLASH_DOCTOR_SEPARATE_WARM_UP"  # 1: a lone rank gets the separate warm-up child, as before
STOP_GRACE_S = 5.0  # a rank stopped before its go has nothing to save: SIGTERM, then SIGKILL after this
REFRESH_S = 0.5  # how often its process tree is re-read before supervision takes over (compile workers)


def starts_beside_the_gate(plan: LaunchPlan, environ: Mapping[str, str]) -> bool:
    """A lone rank started directly (one process in all), unless the way back is asked for."""
    return plan.launcher == "direct" and environ.get(SEPARATE_ENV, "") in ("", "0")


@dataclass(frozen=True)
class RankReport:
    """What the rank said before its go: its compile's report, or why it failed, or nothing (it ended)."""

    ready: dict[str, Any] | None = None
    failed: str | None = None
    exit_code: int | None = None  # when it ended before its go


class LoneRank:
    """The rank's process tree, held from its start beside the gate until supervision takes it (`go`) or the
    launch is refused (`stop`). Its stderr is kept meanwhile; its tree is re-read in a thread, so compile
    workers it started are known (and stopped) even if the rank itself is gone."""

    def __init__(self, launched: Launched, link: LauncherLink) -> None:
        self.launched, self.link = launched, link
        self._closed = False  # supervision ended, or it was stopped: nothing left to stop
        self._done = threading.Event()  # no more refreshing: supervision has the tree, or it was stopped
        self._refresher = threading.Thread(target=self._refresh, name="lone-rank-tree", daemon=True)
        self._refresher.start()

    @classmethod
    def start(
        cls, command: list[str], environ: dict[str, str], stop_log: Path, stdout_to_stderr: bool
    ) -> LoneRank:
        link = LauncherLink.pair()
        try:
            launched = launch_tree(
                command,
                {**environ, GO_FD_ENV: str(link.child_fd)},
                stop_log=stop_log,
                stdout_to_stderr=stdout_to_stderr,
                hold=True,
                pass_fds=(link.child_fd,),
            )
        except BaseException:
            link.close()
            raise
        link.child_started()
        return cls(launched, link)

    def _refresh(self) -> None:
        while not self._done.wait(REFRESH_S):
            self.launched.tree.refresh()

    def _hand_over(self) -> None:
        """Stop the refreshing thread: from here on one thread at a time reads the tree."""
        self._done.set()
        self._refresher.join()

    def wait_report(self) -> RankReport:
        """Block until the rank has compiled, failed its compile, or ended (a stop signal interrupts it)."""
        proc = self.launched.proc
        message = self.link.wait_report(lambda: proc.poll() is None)
        if "ready" in message and isinstance(message["ready"], dict):
            return RankReport(ready=message["ready"])
        if "failed" in message:
            with contextlib.suppress(Exception):
                proc.wait(timeout=STOP_GRACE_S)  # it raises on: its exit code, when it comes
            return RankReport(failed=str(message["failed"]), exit_code=proc.poll())
        return RankReport(exit_code=proc.wait())

    def held_stderr(self) -> list[str]:
        return self.launched.relay.held

    def go(self) -> Launched:
        """The gate passed and the run is recorded: show what the rank wrote so far, tell it to train, and
        hand its tree to supervision (`supervise.supervise_tree`)."""
        self._hand_over()
        self.launched.relay.release()
        with contextlib.suppress(OSError):  # a rank that already ended: supervision reads its exit code
            self.link.go()
        return self.launched

    def hand_over_ended(self) -> Launched:
        """The rank ended before its go: supervision reads its exit code and shows what it wrote."""
        self._hand_over()
        self.launched.relay.release()
        return self.launched

    def stop(self, grace_s: float = STOP_GRACE_S) -> int:
        """A refused launch (or our own unwinding): no go, its tree stopped and reaped, its output dropped.
        Returns how many processes had to be killed."""
        if self._closed:
            return 0
        self._closed = True
        self._hand_over()
        self.launched.relay.discard()
        self.link.close()  # the rank reads end-of-file: it stops even if our signal missed it
        tree = self.launched.tree
        tree.refresh()
        tree.send(signal.SIGTERM)
        tree.wait_gone(time.monotonic() + grace_s)
        killed = tree.kill_all()
        with contextlib.suppress(Exception):
            self.launched.proc.wait(timeout=grace_s)
        self.launched.relay.join(timeout=5)
        return killed

    def close(self) -> None:
        """After supervision ended: our end of the link goes too."""
        self._closed = True
        self._hand_over()
        self.link.close()
