"""Run the deep probe in a child process of the audited interpreter and read its one JSON answer.

The child (`probe_child.py`) is stdlib + torch only, so it runs in any environment, even one where
dflash_doctor is not installed. It gets a timeout: a hung CUDA init must not hang `check`; on timeout (or our
own interruption) the child and every process it started are stopped (`dflash_doctor.processes.run_child`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHILD = Path(__file__).with_name("probe_child.py")
DEFAULT_TIMEOUT_S = 300.0  # a cold CPU compile of flex takes ~30 s on 2 cores; CUDA init of 8 GPUs adds more
TIMEOUT_ENV = "DFLASH_DOCTOR_DEEP_TIMEOUT"
FLEX_ENV = "DFLASH_DOCTOR_DEEP_FLEX"  # "0": skip the flex proof (the slow part on CPU)
CACHE_ENV = "DFLASH_DOCTOR_DEEP_INDUCTOR_CACHE"  # a folder, or "inherit"; default: a fresh temp folder


@dataclass
class ProbeReport:
    """The child's JSON (`raw`), or why there is none (`error`, with the child's stderr tail)."""

    raw: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    stderr_tail: list[str] = field(default_factory=list)
    seconds: float | None = None

    @property
    def ran(self) -> bool:
        return self.error is None

    @property
    def import_ok(self) -> bool:
        return bool(self.raw.get("import", {}).get("ok"))

    @property
    def import_error(self) -> dict[str, Any]:
        return dict(self.raw.get("import") or {})

    @property
    def torch(self) -> dict[str, Any]:
        return dict(self.raw.get("torch") or {})

    @property
    def cuda(self) -> dict[str, Any]:
        return dict(self.raw.get("cuda") or {})

    @property
    def loaded(self) -> list[str]:
        return list((self.raw.get("libraries") or {}).get("loaded") or [])

    @property
    def versions(self) -> dict[str, dict[str, Any]]:
        return dict((self.raw.get("libraries") or {}).get("versions") or {})

    @property
    def flex(self) -> dict[str, Any]:
        return dict(self.raw.get("flex") or {})

    def lock_runtime(self) -> dict[str, Any]:
        """What `lock --deep` records: context overhead per device and the loaded libraries' versions."""
        return {
            "context_overhead_mib": dict(self.cuda.get("context_overhead_mib") or {}),
            "loaded_versions": {name: v.get("parsed") for name, v in self.versions.items() if "parsed" in v},
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "raw": self.raw,
            "error": self.error,
            "stderr_tail": self.stderr_tail,
            "seconds": self.seconds,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProbeReport:
        """The inverse of `to_json` (a kept probe); a malformed one raises ValueError."""
        raw, error, tail = data.get("raw"), data.get("error"), data.get("stderr_tail")
        seconds = data.get("seconds")
        if (
            not isinstance(raw, dict)
            or not (error is None or isinstance(error, str))
            or not isinstance(tail, list)
            or not (seconds is None or isinstance(seconds, int | float))
        ):
            raise ValueError("not a probe report")
        return cls(raw=raw, error=error, stderr_tail=[str(line) for line in tail], seconds=seconds)


def probe_source_digest() -> str:
    """sha256 of the probe child: a changed probe proves other things, so its old verdicts do not carry."""
    return hashlib.sha256(CHILD.read_bytes()).hexdigest()


def run_probe(
    interpreter: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    flex: bool = True,
    cuda: bool = True,
    inductor_cache: str | None = None,
    cancel: threading.Event | None = None,
) -> ProbeReport:
    """Run the child with `interpreter`; never raises for a broken environment (that is the finding).

    The compile cache goes to a fresh temp folder (removed afterwards) unless `inductor_cache` names
    one, or is "inherit" to use what the environment says. `cancel`: the probe runs beside other work
    (`launch/beside.py`); setting it stops the child (`ChildCancelled`).
    """
    scratch = None
    if inductor_cache is None:
        scratch = tempfile.mkdtemp(prefix="dflash-probe-")
        inductor_cache = scratch
    elif inductor_cache != "inherit" and (unwritable := _unwritable(inductor_cache)) is not None:
        return ProbeReport(error=unwritable)  # said, not "the probe crashed" (issue 58, N10)
    args = [interpreter, str(CHILD), "--inductor-cache", inductor_cache]
    args += [] if flex else ["--no-flex"]
    args += [] if cuda else ["--no-cuda"]
    from dflash_doctor.processes import ChildTimedOut, run_child

    try:
        done = run_child(
            args,
            timeout,
            "the probe",
            cwd=tempfile.gettempdir(),  # never import a `torch/` folder from the user's cwd
            cancel=cancel,
        )
    except ChildTimedOut as exc:
        return ProbeReport(error=exc.message, stderr_tail=exc.stderr.splitlines()[-12:])
    except OSError as exc:
        return ProbeReport(error=f"cannot run {interpreter}: {exc}")
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return parse_probe_output(done.stdout, done.stderr, done.returncode)


def _unwritable(folder: str) -> str | None:
    """Why the probe's compile cache `folder` cannot be written (a read-only DFLASH_DOCTOR_HOME), or None."""
    try:
        os.makedirs(folder, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-")  # noqa: SIM115
        probe.close()
    except OSError as exc:
        return (
            f"the probe compiles its flex proof into {folder}, which cannot be written ({exc.strerror}): "
            f"set {CACHE_ENV} (or DFLASH_DOCTOR_HOME) to a folder you can write"
        )
    return None


def parse_probe_output(stdout: str, stderr: str, returncode: int) -> ProbeReport:
    """Pure: the last JSON line of stdout is the report; anything else is a crash (e.g. a segfault)."""
    tail = stderr.strip().splitlines()[-12:]
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                raw = json.loads(line)
            except json.JSONDecodeError:
                break
            return ProbeReport(raw=raw, stderr_tail=tail, seconds=raw.get("seconds"))
    how = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
    return ProbeReport(error=f"the probe crashed ({how}) before printing its report", stderr_tail=tail)


def probe_timeout() -> float:
    try:
        return float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S


def probe_of(ctx: Any) -> Callable[[threading.Event | None], ProbeReport]:
    """The probe this check run asks for (`ctx.options.extra` decides flex and the cache), as a function
    of a cancel event: the gate runs it in a thread beside the static checks."""
    options = getattr(ctx.options, "extra", {}) or {}
    flex = options.get("deep_flex", os.environ.get(FLEX_ENV, "1") != "0")
    cache = options.get("deep_inductor_cache", os.environ.get(CACHE_ENV) or None)
    # Why the proof is skipped, in the caller's terms (the child only knows it got `--no-flex`).
    why_not = (
        "this launch trains without flex_attention (SDPA on CPU)"
        if "deep_flex" in options
        else f"{FLEX_ENV}=0"
    )

    def probe(cancel: threading.Event | None = None) -> ProbeReport:
        report = run_probe(
            ctx.env.interpreter.executable, probe_timeout(), flex=flex, inductor_cache=cache, cancel=cancel
        )
        skipped = report.raw.get("flex")
        if not flex and isinstance(skipped, dict) and skipped.get("status") == "skipped":
            skipped["reason"] = why_not
        return report

    return probe


def deep_report(ctx: Any) -> ProbeReport:
    """The probe of the audited interpreter, run once per check run (`ctx.shared("deep.report")`)."""
    return ctx.shared("deep.report", probe_of(ctx))
