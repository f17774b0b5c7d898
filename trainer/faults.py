"""A testing hook: make a rank fail on purpose, to prove the job then exits non-zero instead of hanging.

Set `DFLASH_FAULT=target_exit_at_batch:K`: the target rank that is about to produce global batch K exits
with status 3 at once (as a crashed or OOM-killed target would). Read here and nowhere else; unset in
normal runs.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

ENV = "DFLASH_FAULT"
FAULT_EXIT_CODE = 3


@dataclass(frozen=True)
class Fault:
    kind: str
    at: int


def fault_from_env() -> Fault | None:
    spec = os.environ.get(ENV, "").strip()
    if not spec:
        return None
    kind, _, at = spec.partition(":")
    if kind != "target_exit_at_batch" or not at.isdigit():
        raise ValueError(f"{ENV}={spec!r}: expected target_exit_at_batch:<batch index>")
    return Fault(kind, int(at))


def maybe_exit_target(fault: Fault | None, rank: int, batch_index: int) -> None:
    """Exit this target rank now if the fault says so (no cleanup: like a crash)."""
    if fault is not None and fault.kind == "target_exit_at_batch" and batch_index == fault.at:
        print(
            f"dflash trainer: target rank {rank} exiting at batch {batch_index} ({ENV}={fault.kind}:{fault.at}, a testing hook)",
            file=sys.stderr,
            flush=True,
        )
        os._exit(FAULT_EXIT_CODE)
