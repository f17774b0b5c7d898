"""What build a compile cache is for, and whether two builds can share one.

Inductor's cache keys hash the torch build (version and its Python sources), the CUDA version, the
Triton version and the GPU *name*: a cache made on an H100 does not serve an H200, and a reinstall of
"the same" torch from another commit misses every entry. A fingerprint records those facts, read from
the static Environment model (no `import torch`) plus GPU names from NVML.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only a type here: restore must not pay for the environment model's imports
    from dflash_doctor.env.environment import Environment


@dataclass(frozen=True)
class BuildFingerprint:
    """The facts Inductor folds into its keys that we can know without importing torch.

    ``gpu_names`` is None when unknown (no driver, NVML unavailable), () on a machine without GPUs.
    """

    torch_version: str | None
    torch_git: str | None
    cuda: str | None
    triton_version: str | None
    python: str
    gpu_names: tuple[str, ...] | None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["gpu_names"] = list(self.gpu_names) if self.gpu_names is not None else None
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BuildFingerprint:
        gpus = data.get("gpu_names")
        return cls(
            torch_version=_text(data.get("torch_version")),
            torch_git=_text(data.get("torch_git")),
            cuda=_text(data.get("cuda")),
            triton_version=_text(data.get("triton_version")),
            python=str(data.get("python") or ""),
            gpu_names=tuple(str(g) for g in gpus) if isinstance(gpus, list) else None,
        )

    def describe(self) -> str:
        """One line for tables: `torch 2.11.0+cu130 (70d99e998b49) · NVIDIA H200 · py3.11`."""
        commit = f" ({self.torch_git[:12]})" if self.torch_git else ""
        devices = ", ".join(sorted(set(self.gpu_names))) if self.gpu_names else "cpu"
        return f"torch {self.torch_version or '?'}{commit} · {devices} · py{self.python}"


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def read_gpu_names() -> tuple[str, ...] | None:
    """GPU names through NVML (dflash_doctor.env.gpus), as the driver reports them; None without a driver."""
    from dflash_doctor.env.gpus import query_gpus

    inventory = query_gpus()
    return None if inventory is None else tuple(d.name for d in inventory.host)  # the machine's, as before


def fingerprint_of(env: Environment, gpu_names: tuple[str, ...] | None = None) -> BuildFingerprint:
    """The fingerprint of an audited environment (files only) and the GPUs of this machine."""
    build = env.torch
    triton = env.get("triton") or env.get("pytorch-triton")
    python = ".".join(env.interpreter.version.split(".")[:2])
    return BuildFingerprint(
        torch_version=build.version if build else None,
        torch_git=build.git_version if build else None,
        cuda=build.cuda if build else None,
        triton_version=triton.version if triton else None,
        python=python,
        gpu_names=gpu_names,
    )


def incompatibilities(made_for: BuildFingerprint, current: BuildFingerprint) -> list[str]:
    """Why a cache made for `made_for` would miss in `current`; empty when it would hit.

    GPU names only count when both sides know them and the cache was made on GPUs: a CPU cache
    still serves the CPU kernels of a GPU machine, and an unknown side cannot be held against it.
    """
    reasons = []
    pairs = [
        ("torch version", made_for.torch_version, current.torch_version),
        ("torch git commit", made_for.torch_git, current.torch_git),
        ("CUDA", made_for.cuda, current.cuda),
        ("triton version", made_for.triton_version, current.triton_version),
        ("python", made_for.python, current.python),
    ]
    for label, theirs, ours in pairs:
        if theirs != ours:
            reasons.append(f"{label} {theirs or 'none'} != {ours or 'none'} here")
    gpus_known = made_for.gpu_names and current.gpu_names is not None
    if gpus_known and sorted(set(made_for.gpu_names or ())) != sorted(set(current.gpu_names or ())):
        theirs = ", ".join(sorted(set(made_for.gpu_names or ())))
        ours = ", ".join(sorted(set(current.gpu_names or ()))) or "no GPU"
        reasons.append(f"GPU {theirs} != {ours} here")
    return reasons
