"""`cache warm`: compile what training compiles, in one child process of the audited interpreter,
main thread, no threads; then the caller snapshots the result.

The child is `warm_child.py`, run by path, so it works in an environment where dflash-doctor is not
installed (it needs only torch). Proof that a compile happened (or was served from the cache) comes
from the child's `torch._dynamo.utils.counters`.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_base.errors import DoctorError
from dflash_doctor.cache import warm_child

CHILD_SCRIPT = Path(warm_child.__file__).resolve()
PROJECT_ROOT = CHILD_SCRIPT.parents[2]


@dataclass(frozen=True)
class WarmShapes:
    """flex_attention shapes of the fallback warm-up (the story's: 32, 128, 8, 1024, 32, 40000)."""

    heads: int = 4
    head_dim: int = 64
    kv_heads: int = 2
    anchors: int = 8
    block: int = 16
    context: int = 256

    def validate(self) -> None:
        for name, value in vars(self).items():
            if value < 1:
                raise DoctorError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.heads % self.kv_heads:
            raise DoctorError(f"--heads {self.heads} is not a multiple of --kv-heads {self.kv_heads}")
        if self.anchors >= self.context:
            raise DoctorError(
                f"--anchors {self.anchors} must be fewer than --context {self.context} positions"
            )


DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def check_device(device: str) -> None:
    """`--device`: cpu, cuda or cuda:N, refused before the child starts (`tpu` was refused by torch inside
    the child, seconds later, as a warm-up failure)."""
    if not DEVICE.fullmatch(device):
        raise DoctorError(
            f"--device {device!r}: the warm-up compiles for cpu, cuda or cuda:N",
            hint="--device cpu, or --device cuda:0 on a GPU machine",
        )


def child_command(
    python: str,
    device: str,
    shapes: WarmShapes,
    config: Path | None = None,
    backward: str = "auto",
    trainer_devices: tuple[str, ...] = (),
) -> list[str]:
    """The warm-up child's command. `trainer_devices` (with a config): warm each, one after another;
    Inductor's graph cache is keyed by the inputs' device index, so cuda:0 does not serve cuda:1."""
    command = [python, str(CHILD_SCRIPT), "--device", device, "--backward", backward]
    for name, value in vars(shapes).items():
        command += [f"--{name.replace('_', '-')}", str(value)]
    if config is not None:
        command += ["--config", str(config), "--project-root", str(PROJECT_ROOT)]
        for trainer_device in trainer_devices:
            command += ["--trainer-device", trainer_device]
    return command


def parse_child_output(stdout: str) -> dict[str, Any] | None:
    """The child's result line, or None when it printed none."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(warm_child.RESULT_PREFIX):
            try:
                data = json.loads(line[len(warm_child.RESULT_PREFIX) :])
            except json.JSONDecodeError:
                return None
            return data if isinstance(data, dict) else None
    return None


def compile_count(result: Mapping[str, Any]) -> tuple[int, int]:
    """(fxgraph cache misses, hits) the child's counters recorded: misses mean it compiled."""
    inductor = result.get("counters", {}).get("inductor", {})
    return int(inductor.get("fxgraph_cache_miss", 0)), int(inductor.get("fxgraph_cache_hit", 0))


def run_warm_child(
    command: list[str],
    environ: Mapping[str, str],
    timeout: float = 3600.0,
    cancel: threading.Event | None = None,
    pass_fds: tuple[int, ...] = (),
) -> dict[str, Any]:
    """Run the warm-up child; a DoctorError with the child's last words when it fails or times out. Its
    compile workers are stopped with it, whatever happens (`dflash_doctor.processes.run_child`). It runs in
    this process's working directory, as the workers do: a config's relative paths (target.path, data.path)
    mean the same to both."""
    from dflash_doctor.processes import run_child

    try:
        done = run_child(
            command,
            timeout,
            "warm-up",
            env=environ,
            cwd=os.getcwd(),
            hint="run it alone, or with smaller shapes",
            cancel=cancel,
            pass_fds=pass_fds,  # the cache folders' locks: held by the child while it compiles, whatever kills us
        )
    except OSError as exc:
        raise DoctorError(f"could not start {command[0]}: {exc}") from exc
    result = parse_child_output(done.stdout)
    if done.returncode != 0 or result is None:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise DoctorError(f"warm-up failed (exit {done.returncode}): {tail}", hint=" ".join(command))
    return result


def child_environ(base: Mapping[str, str], inductor_dir: Path, triton_dir: Path | None) -> dict[str, str]:
    """The child compiles into the folders we will snapshot, whatever defaults its torch has."""
    environ = dict(base)
    environ["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_dir)
    if triton_dir is not None:
        environ["TRITON_CACHE_DIR"] = str(triton_dir)
    return environ
