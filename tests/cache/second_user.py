"""A real second user for the attack tests: a child process that drops to uid 65534 ('nobody') and acts
in a folder when told, as another local user racing a root restore would.

The child is forked before the restore starts any thread, opens the shared folder as root first (so it
needs no access to the test's private folders above it), drops every privilege, then waits. Each
`strike()` runs its action once, through that folder's handle, and returns what happened: "done", or
the name of the error the kernel gave it (EEXIST, EPERM, ...), so a test sees what the attacker could
and could not do.
"""

from __future__ import annotations

import errno
import os
import pwd
from collections.abc import Callable
from pathlib import Path

import pytest


def _nobody() -> int:
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return 65534


OTHER_USER = _nobody()
needs_second_user = pytest.mark.skipif(
    os.getuid() != 0, reason="acting as a second user (uid 65534) needs root to change uid"
)


class SecondUser:
    """A child running as OTHER_USER, acting in `folder` (through a handle opened before the drop)."""

    def __init__(self, folder: Path, action: Callable[[int], object]) -> None:
        handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        go_read, self._go = os.pipe()
        self._answers, answer_write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - the child
            os.close(self._go)
            os.close(self._answers)
            code = 0
            try:
                os.setgroups([])
                os.setresgid(OTHER_USER, OTHER_USER, OTHER_USER)
                os.setresuid(OTHER_USER, OTHER_USER, OTHER_USER)
                while os.read(go_read, 1) == b"g":
                    try:
                        action(handle)
                        answer = "done"
                    except OSError as exc:
                        answer = errno.errorcode.get(exc.errno or 0, str(exc))
                    os.write(answer_write, answer.encode().ljust(16))
            except BaseException:
                code = 1
            os._exit(code)
        os.close(handle)
        os.close(go_read)
        os.close(answer_write)
        self.answers: list[str] = []

    def strike(self) -> str:
        """Run the action once in the child; what happened."""
        os.write(self._go, b"g")
        answer = os.read(self._answers, 16).decode().strip()
        self.answers.append(answer)
        return answer

    def close(self) -> None:
        os.write(self._go, b"q")
        os.close(self._go)
        os.close(self._answers)
        os.waitpid(self.pid, 0)

    def __enter__(self) -> SecondUser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
