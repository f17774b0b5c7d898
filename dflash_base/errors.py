"""Errors a person can act on. The CLI turns every one of them into exit code 2.

`dflash_doctor.cli.run` catches them in one place and prints the message (no traceback).
"""

from __future__ import annotations


class DoctorError(Exception):
    """Bad usage, bad input or a bad config: says what is wrong and what to do. Exit code 2."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message}\n  hint: {hint}")


class InterpreterError(DoctorError):
    """The interpreter given with --python cannot be asked for its paths."""


class ConfigError(DoctorError):
    """A config file is malformed; the message names the field."""
