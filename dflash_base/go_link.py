"""The line between the launcher and a lone rank it started beside its gate: "compiled", then "go".

A launch of one process in all has no compile race between workers, so `dflash-doctor train` starts the rank
while the gate still runs (`dflash_doctor/launch/lone_rank.py`): the rank imports, builds and compiles its own
graphs, says so, and trains only once the launcher says the gate passed. One AF_UNIX socket pair carries it:
the launcher keeps one end and hands the other to the rank (its number in `GO_FD_ENV`). Why a socket, not a
file the launcher creates: the kernel closes the launcher's end whatever ends it (SIGKILL included), so the rank
reads end-of-file at once and stops, with no polling and no stale "go" file a later launch could misread; and
the rank's own report (compiled, or its compile failed and why) travels back on the same pair.

Messages are JSON lines. Rank to launcher: `{"ready": {...}}` (its compile done, with its counters) or
`{"failed": "..."}` (its compile raised). Launcher to rank: `{"go": true}`. End-of-file before "go": the
launcher refused the launch or is gone; the rank stops (SIGTERM to itself: its stop handlers unwind it). Standard
library only: the rank reads its end before torch is imported.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from dflash_base.stopping import stop_this_process

GO_FD_ENV = "DFLASH_DOCTOR_GO_FD"
POLL_S = 0.2  # how often a wait looks up from the socket (a stop signal, a process that ended)


# What torch appends to every compile error: not the error, so never the line that names it.
TORCH_HINTS = (
    "Set TORCHDYNAMO_VERBOSE=1",
    "For even more developer context",
    "You can suppress this exception",
)


def last_line(exc: BaseException) -> str:
    """The line of an exception's message that says what failed: its last, torch's own hints left out."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(TORCH_HINTS)]
    return lines[-1] if lines else ""


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall((json.dumps(message, default=str) + "\n").encode())


class RankLink:
    """The rank's end: report the compile, wait for the go; the launcher's end closing stops this process.

    `watch()` reads the socket in a daemon thread from the rank's first moments (before torch is imported),
    so a launcher killed outright stops the rank within a second whatever it is doing, as `parent_watch`
    does later for every rank. Until the go, the rank's stdout is held here (`hold_stdout`): a launch the gate
    then refuses prints nothing of a rank it stopped.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.go = threading.Event()
        self.gone = threading.Event()  # the launcher's end closed before the go, or after it
        self._stdout: TextIO | None = None

    @classmethod
    def from_environ(cls) -> RankLink | None:
        """The link the launcher gave this process, or None (started by torchrun, by hand, or the old way).
        The variable is removed, so a process this one starts never takes the number for a link of its own."""
        value = os.environ.pop(GO_FD_ENV, "")
        if not value.isdigit():
            return None
        fd = int(value)
        os.set_inheritable(fd, False)  # the rank's own children (compile workers) never hold it
        return cls(socket.socket(fileno=fd))

    def watch(self, grace_s: float) -> threading.Thread:
        """Read the launcher's messages in a daemon thread. End-of-file: SIGTERM to this process (its stop
        handlers raise Stopped in the main thread), and `os._exit` after `grace_s` if it is stuck in a call
        that never returns to Python."""

        def read() -> None:
            buffer = b""
            while True:
                try:
                    chunk = self.sock.recv(4096)
                except OSError:
                    chunk = b""
                if not chunk:
                    break
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    with contextlib.suppress(ValueError):
                        if json.loads(line).get("go") is True:
                            self.go.set()
            self.gone.set()
            stop_this_process(grace_s)

        thread = threading.Thread(target=read, name="launcher-link", daemon=True)
        thread.start()
        return thread

    def hold_stdout(self) -> None:
        """Keep what this process prints on sys.stdout until the go (written out then, dropped otherwise)."""
        if self._stdout is None:
            self._stdout, sys.stdout = sys.stdout, io.StringIO()

    def _release_stdout(self) -> None:
        if self._stdout is not None:
            held = sys.stdout.getvalue() if isinstance(sys.stdout, io.StringIO) else ""
            sys.stdout, self._stdout = self._stdout, None
            sys.stdout.write(held)
            sys.stdout.flush()

    @contextlib.contextmanager
    def compiling(self) -> Iterator[None]:
        """A compile whose failure the launcher must hear about as a warm-up failure (not a run's failure)."""
        try:
            yield
        except Exception as exc:
            with contextlib.suppress(OSError):
                _send(self.sock, {"failed": f"{type(exc).__name__}: {last_line(exc)}"[:500]})
            raise

    def ready(self, report: dict[str, Any]) -> None:
        """The compile is done: the launcher may record the warm-up and, once its gate passed, say go."""
        _send(self.sock, {"ready": report})

    def wait_for_go(self) -> None:
        """Block until the launcher's go; its end closing instead stops this process (see `watch`)."""
        while not self.go.wait(POLL_S):
            pass
        self._release_stdout()


def compiling(link: RankLink | None) -> contextlib.AbstractContextManager[None]:
    """`link.compiling()`, or nothing without a link."""
    return link.compiling() if link is not None else contextlib.nullcontext()


class LauncherLink:
    """The launcher's end: wait for the rank's report, then say go; closing it (or dying) stops the rank."""

    def __init__(self, sock: socket.socket, child: socket.socket) -> None:
        self.sock, self.child = sock, child
        self._buffer = b""

    @classmethod
    def pair(cls) -> LauncherLink:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        return cls(ours, theirs)

    @property
    def child_fd(self) -> int:
        """The number to hand the rank (`pass_fds`, and in `GO_FD_ENV`)."""
        return self.child.fileno()

    def child_started(self) -> None:
        """The rank holds its copy now: ours is closed, so the rank's end-of-file means the rank is gone."""
        self.child.close()

    def wait_report(self, running: Callable[[], bool]) -> dict[str, Any]:
        """The rank's report: `{"ready": ...}` or `{"failed": ...}`; `{}` when it ended (or closed its end)
        without one. `running()` is asked between polls: a process of the rank's that outlives it (a forked
        worker holding its end) never makes this wait for ever."""
        while True:
            if b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                with contextlib.suppress(ValueError):
                    message = json.loads(line)
                    if isinstance(message, dict) and ("ready" in message or "failed" in message):
                        return message
                continue
            readable, _, _ = select.select([self.sock], [], [], POLL_S)
            if not readable:
                if not running():
                    return {}
                continue
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                return {}
            self._buffer += chunk

    def go(self) -> None:
        _send(self.sock, {"go": True})

    def close(self) -> None:
        """No go will come: the rank reads end-of-file and stops."""
        with contextlib.suppress(OSError):
            self.child.close()
        with contextlib.suppress(OSError):
            self.sock.close()
