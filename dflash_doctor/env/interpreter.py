"""Which interpreter is audited, and what its import path looks like.

`--python PATH` audits another interpreter's environment (a venv the tool is not installed in):
we ask that interpreter for its `sys.path` and prefixes, once, and read its files from here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import sysconfig
from dataclasses import asdict, dataclass, field

from dflash_base.errors import InterpreterError

# Runs inside the audited interpreter. Plain stdlib, no imports of anything it may have broken.
_PROBE = r"""
import json, os, platform, site, sys, sysconfig
paths = sysconfig.get_paths()
print(json.dumps({
    "executable": sys.executable,
    "version": "%d.%d.%d" % sys.version_info[:3],
    "implementation": sys.implementation.name,
    "prefix": sys.prefix,
    "base_prefix": sys.base_prefix,
    "sys_path": [p for p in sys.path if p],
    "purelib": paths.get("purelib"),
    "platlib": paths.get("platlib"),
    "user_site": site.getusersitepackages() if site.ENABLE_USER_SITE else None,
    "machine": platform.machine(),
    "ld_library_path": os.environ.get("LD_LIBRARY_PATH", ""),
    "cache_tag": sys.implementation.cache_tag,
    "site_disables_bytecode": sys.dont_write_bytecode and not sys.flags.dont_write_bytecode,
}))
"""


@dataclass(frozen=True)
class InterpreterInfo:
    """What we need to know about an interpreter to read its environment from outside."""

    executable: str
    version: str
    prefix: str
    base_prefix: str
    sys_path: list[str]
    purelib: str | None = None
    platlib: str | None = None
    user_site: str | None = None
    implementation: str = "cpython"
    machine: str = ""
    ld_library_path: str = ""
    is_current: bool = False
    extra: dict[str, str] = field(default_factory=dict)
    # The name part of its bytecode files (`cpython-312` in `__pycache__/os.cpython-312.pyc`); None when unknown.
    cache_tag: str | None = None
    # Its start-up (sitecustomize, usercustomize, a .pth file) set sys.dont_write_bytecode: no .pyc gets written.
    site_disables_bytecode: bool = False

    @property
    def site_dirs(self) -> list[str]:
        """Existing sys.path folders, in import order (where distributions can live)."""
        return [p for p in self.sys_path if os.path.isdir(p)]

    def to_json(self) -> dict[str, object]:
        return asdict(self)


NOT_A_PYTHON_HINT = "give a python executable, e.g. .venv/bin/python"


def current_interpreter() -> InterpreterInfo:
    paths = sysconfig.get_paths()
    import site

    return InterpreterInfo(
        executable=sys.executable,
        version=".".join(str(p) for p in sys.version_info[:3]),
        prefix=sys.prefix,
        base_prefix=sys.base_prefix,
        sys_path=[os.path.abspath(p) for p in sys.path if p],
        purelib=paths.get("purelib"),
        platlib=paths.get("platlib"),
        user_site=site.getusersitepackages() if site.ENABLE_USER_SITE else None,
        implementation=sys.implementation.name,
        machine=os.uname().machine,
        ld_library_path=os.environ.get("LD_LIBRARY_PATH", ""),
        is_current=True,
        cache_tag=sys.implementation.cache_tag,
        site_disables_bytecode=sys.dont_write_bytecode and not sys.flags.dont_write_bytecode,
    )


def probe_interpreter(python: str, timeout: float = 30.0) -> InterpreterInfo:
    """Ask another interpreter for its paths. Raises InterpreterError (exit 2) with what to do."""
    return InterpreterProbe(python, timeout).result()


class InterpreterProbe:
    """`probe_interpreter`, started now and answered later: the child interpreter starts up (~20 ms)
    while this process does other work (`check` imports its check modules meanwhile).

    Nothing is raised before `result()`, so errors come in the same order as with a plain probe.
    """

    def __init__(self, python: str, timeout: float = 30.0) -> None:
        self.python = os.path.abspath(python)
        self.timeout = timeout
        self._error: InterpreterError | None = None
        self._child: subprocess.Popen[str] | None = None
        try:
            self._child = self._start()
        except InterpreterError as exc:
            self._error = exc

    def _start(self) -> subprocess.Popen[str]:
        python = self.python
        if not os.path.exists(python):
            raise InterpreterError(
                f"--python {python}: no such file",
                hint="give the path of a python executable, e.g. .venv/bin/python",
            )
        if not os.access(python, os.X_OK) or os.path.isdir(python):
            raise InterpreterError(f"--python {python}: not an executable file")
        try:
            return subprocess.Popen(
                [python, "-c", _PROBE],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
                cwd=os.path.dirname(os.path.abspath(python)) or "/",
                # Its own process group: a wrapper script's children (no `exec`) hold our pipes open,
                # so on a time-out the whole group is killed, not only the script (issue 18, row 2).
                start_new_session=True,
            )
        except OSError as exc:
            raise InterpreterError(f"--python {python}: could not run it ({exc})") from exc

    def cancel(self) -> None:
        """Stop a probe whose answer is no longer wanted (e.g. the command failed on bad options)."""
        if self._child is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._child.pid, signal.SIGKILL)  # the script and anything it started
        if self._child.poll() is None:
            self._child.kill()
        self._child.communicate()

    def result(self) -> InterpreterInfo:
        if self._error is not None:
            raise self._error
        assert self._child is not None
        python = self.python
        try:
            stdout, stderr = self._child.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired as exc:
            self.cancel()
            raise InterpreterError(
                f"--python {python}: no answer within {self.timeout:.0f} s",
                hint='give a python executable; a wrapper script must end with `exec python "$@"`',
            ) from exc
        if self._child.returncode != 0:
            last = (stderr.strip().splitlines() or [""])[-1]
            said = f": {last}" if 0 < len(last) <= 120 else ""  # not a program's echo of the whole script
            raise InterpreterError(
                f"--python {python}: not a python that runs (asked to run a line of Python, it exited "
                f"{self._child.returncode}{said})",
                hint=NOT_A_PYTHON_HINT,
            )
        try:
            raw = json.loads(stdout.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError) as exc:
            raise InterpreterError(
                f"--python {python}: not a python (asked to run a line of Python, it answered "
                f"{stdout[:200]!r})",
                hint=NOT_A_PYTHON_HINT,
            ) from exc
        return InterpreterInfo(
            executable=raw["executable"],
            version=raw["version"],
            prefix=raw["prefix"],
            base_prefix=raw["base_prefix"],
            sys_path=[os.path.abspath(p) for p in raw["sys_path"]],
            purelib=raw.get("purelib"),
            platlib=raw.get("platlib"),
            user_site=raw.get("user_site"),
            implementation=raw.get("implementation", "cpython"),
            machine=raw.get("machine", ""),
            ld_library_path=raw.get("ld_library_path", ""),
            is_current=False,
            cache_tag=raw.get("cache_tag"),
            site_disables_bytecode=bool(raw.get("site_disables_bytecode", False)),
        )


def interpreter_for(python: str | None) -> InterpreterInfo:
    """The interpreter to audit: the one given with --python, or the one running us."""
    return current_interpreter() if python is None else probe_interpreter(python)
