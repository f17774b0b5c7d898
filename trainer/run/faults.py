"""Testing hooks: make a rank fail on purpose, to prove the job exits or resumes as it should.

`DFLASH_FAULT` (read here and nowhere else; unset in normal runs):
- `target_exit_at_batch:K`: the target rank about to produce global batch K exits with status 3 at once,
  as a crashed or OOM-killed target would. The job must then stop non-zero within a bounded time.
- `drafter_hang_at_step:K`: the first drafter stops after K steps and sleeps, as a hung rank would; the
  resume test kills the job with SIGKILL at that known point.
- `capture_delay_ms:K`: every capture takes K ms longer, as a slow target would; the step-time test knows
  then how much of each step is its capture.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

ENV = "DFLASH_FAULT"
FAULT_EXIT_CODE = 3
KINDS = ("target_exit_at_batch", "drafter_hang_at_step", "capture_delay_ms")


@dataclass(frozen=True)
class Fault:
    kind: str
    at: int


def fault_from_env() -> Fault | None:
    spec = os.environ.get(ENV, "").strip()
    if not spec:
        return None
    kind, _, at = spec.partition(":")
    if kind not in KINDS or not at.isdigit():
        raise ValueError(f"{ENV}={spec!r}: expected one of {', '.join(k + ':<n>' for k in KINDS)}")
    return Fault(kind, int(at))


def _announce(what: str, fault: Fault) -> None:
    print(
        f"dflash trainer: {what} ({ENV}={fault.kind}:{fault.at}, a testing hook)", file=sys.stderr, flush=True
    )


def maybe_exit_target(fault: Fault | None, rank: int, batch_index: int) -> None:
    """Exit this target rank now if the fault says so (no cleanup: like a crash)."""
    if fault is not None and fault.kind == "target_exit_at_batch" and batch_index == fault.at:
        _announce(f"target rank {rank} exiting at batch {batch_index}", fault)
        os._exit(FAULT_EXIT_CODE)


def maybe_hang_drafter(fault: Fault | None, drafter_index: int, steps_done: int) -> None:
    """Stop the first drafter here for good if the fault says so."""
    if (
        fault is not None
        and fault.kind == "drafter_hang_at_step"
        and drafter_index == 0
        and steps_done == fault.at
    ):
        _announce(f"drafter 0 hanging after step {steps_done}", fault)
        while True:
            time.sleep(3600)


def maybe_delay_capture(fault: Fault | None) -> None:
    """A slow target: this capture takes `fault.at` ms longer."""
    if fault is not None and fault.kind == "capture_delay_ms":
        time.sleep(fault.at / 1000)
