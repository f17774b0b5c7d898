"""The drafter's floor: a run can train well and still export a drafter not worth serving. With `[eval]
prompts` in the config, `train` decodes the export once the run succeeded, with `eval` on those prompts (the
engine, every prompt, `max_new_tokens`, no latency rows), records tau beside prompt lookup's, and fails the run
(exit 1, recorded, the export kept) when tau is below `min_tau` or a token was off the target's choice: NVIDIA
Model-Optimizer's `ar_validate` floor, as a step of the launch.

`eval` runs in a child process of the run's own interpreter: the launcher stays free of torch, and a decode that
fails (out of memory, a bad export) is the floor's failure, named, not the launcher's.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

FLOOR_TIMEOUT_S = 3600  # the floor's decode: seconds on a GPU, a long time on a CPU


@dataclass
class FloorResult:
    """What decoding the export on the floor's prompts said."""

    prompts: str
    min_tau: float
    tau: float | None = None
    baseline_tau: float | None = None  # prompt lookup's, on the same prompts
    off: int = 0  # tokens off the target's choice (eval's every-token check)
    seconds: float = 0.0
    problem: str | None = None  # why there is no figure (the decode failed), or what failed the floor

    @property
    def passed(self) -> bool:
        return self.problem is None

    def line(self) -> str:
        """One line for the record's notes and the launch's last lines."""
        if self.tau is None:
            return f"floor: the export was not decoded on {self.prompts}: {self.problem}"
        lookup = f" (prompt lookup {self.baseline_tau:.3f})" if self.baseline_tau is not None else ""
        verdict = "below the floor" if self.tau < self.min_tau else "passed"
        if self.off:
            verdict = f"{self.off} token(s) off the target's choice"
        floor = f"eval.min_tau {self.min_tau:g}" if self.min_tau else "no floor set"
        return f"floor: tau {self.tau:.3f}{lookup} on {self.prompts} in {self.seconds:.0f} s ({floor}): {verdict}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"passed": self.passed}


def floor_command(
    python: str, export: Path, config_path: Path, overrides: list[str], prompts: str, max_new_tokens: int
) -> list[str]:
    """`eval` of the export as the run's config and `--set`s describe the target, on the floor's prompts."""
    sets = [arg for item in overrides for arg in ("--set", item)]
    return [
        python, "-m", "dflash_doctor", "eval", "--export", str(export), "--config", str(config_path), *sets,
        "--prompts", prompts, "--max-new-tokens", str(max_new_tokens), "--latency", "", "--json",
    ]  # fmt: skip


def judge(report: dict[str, Any], prompts: str, min_tau: float, seconds: float) -> FloorResult:
    """The floor's verdict from `eval --json`'s report."""
    tau = float(report["mean_accept_len"])
    baseline = report.get("baseline") or {}
    lossless = report.get("lossless") or {}
    result = FloorResult(
        prompts, min_tau, tau, baseline.get("mean_accept_len"), int(lossless.get("off", 0)), round(seconds, 1)
    )
    if result.off:
        result.problem = f"{result.off} emitted token(s) off the target's choice (eval's every-token check)"
    elif tau < min_tau:
        result.problem = f"tau {tau:.3f} on {prompts} is below eval.min_tau {min_tau:g}"
    return result


def check_floor(
    python: str, export: Path, config_path: Path, overrides: list[str], eval_section: Any
) -> FloorResult:
    """Decode the export on `eval_section.prompts` in a child and judge it against `eval_section.min_tau`."""
    prompts, min_tau = str(eval_section.prompts), float(eval_section.min_tau)
    command = floor_command(python, export, config_path, overrides, prompts, int(eval_section.max_new_tokens))
    began = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=FLOOR_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return FloorResult(prompts, min_tau, problem=f"eval took more than {FLOOR_TIMEOUT_S} s")
    seconds = time.perf_counter() - began
    try:
        report = json.loads(done.stdout)
        if "mean_accept_len" not in report:
            raise ValueError("not an eval report")
    except ValueError:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])[-400:]
        return FloorResult(
            prompts, min_tau, seconds=round(seconds, 1), problem=f"eval exited {done.returncode}: {tail}"
        )
    return judge(report, prompts, min_tau, seconds)
