"""Which CUDA major a distribution belongs to, read from its name, its files and the toolkit's pins.

Soname majors do not tell (CUDA 13 ships `libcusparse.so.12` and `libcurand.so.10`), and the CUDA 13
toolkit packages carry no suffix (`nvidia-cublas 13.1`, `nvidia-cufft 12.0`): so we trust, in order,
an explicit suffix in the name, the `nvidia/cu<N>/` folder the wheel installs into, the pin a
`cuda-toolkit` distribution places on it, and only for a few names the version major. Anything else
gets no verdict (None): better silent than a false alarm.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

# `nvidia-nccl-cu13`, `cupy-cuda12x`, `jax-cuda13-plugin`, `nvidia-dali-cuda120`: an explicit CUDA major.
_NAME_SUFFIX = re.compile(r"(?:^|-)cu(?:da)?(?P<major>1\d)(?:\d|x)?(?:-|$)")

# `nvidia/cu13/lib/libcublas.so.13`: the shared folder of the suffix-less CUDA 13 toolkit packages.
_CU_FOLDER = re.compile(r"(?:^|/)nvidia/cu(?P<major>1\d)/")

# Distributions whose version major is the CUDA major they serve.
_VERSIONED_LIKE_CUDA = frozenset(
    {
        "cuda-toolkit",
        "cuda-bindings",
        "cuda-python",
        "nvidia-cublas",
        "nvidia-cuda-runtime",
        "nvidia-cuda-nvrtc",
        "nvidia-cuda-cupti",
        "nvidia-cuda-nvcc",
        "nvidia-cuda-crt",
        "nvidia-cuda-cccl",
        "nvidia-nvjitlink",
        "nvidia-nvtx",
        "nvidia-nvvm",
        "nvidia-nvfatbin",
        "nvidia-nvptxcompiler",
    }
)

# Names that look CUDA-ish but serve every CUDA major (or none): never a verdict.
_FAMILY_NEUTRAL = frozenset({"nvidia-ml-py", "pynvml", "cuda-pathfinder", "cuda-core", "numba-cuda"})

TOOLKIT_NAME = "cuda-toolkit"


@dataclass(frozen=True)
class CudaFamily:
    """A distribution's CUDA major and the fact that tells it (shown as evidence)."""

    major: int
    reason: str

    def __str__(self) -> str:
        return f"CUDA {self.major} ({self.reason})"


def is_cuda_flavoured(name: str) -> bool:
    """Worth a look: `nvidia-*`, `cuda-*` and names with a CUDA suffix, minus the neutral ones."""
    key = canonicalize_name(name)
    if key in _FAMILY_NEUTRAL:
        return False
    return key.startswith(("nvidia-", "cuda-")) or _NAME_SUFFIX.search(key) is not None


def toolkit_pins(toolkit_version: str, requires: Iterable[str]) -> dict[str, int]:
    """Component name -> CUDA major, for every distribution a `cuda-toolkit` wheel names.

    `cuda-toolkit 13.0.3` pins `nvidia-cufft==12.0.0.61.*`: that cufft is a CUDA 13 part whatever
    its own version says.
    """
    major = _version_major(toolkit_version)
    if major is None:
        return {}
    pins: dict[str, int] = {}
    for line in requires:
        try:
            pins[canonicalize_name(Requirement(line).name)] = major
        except ValueError:
            continue
    return pins


def cuda_family(
    name: str,
    version: str,
    record_paths: Iterable[str] = (),
    pins: Mapping[str, int] | None = None,
) -> CudaFamily | None:
    """The CUDA major of one distribution, or None when nothing reliable says it.

    ``record_paths`` are its RECORD paths (relative or absolute); ``pins`` come from `toolkit_pins`.
    """
    key = canonicalize_name(name)
    if key in _FAMILY_NEUTRAL:
        return None
    suffix = _NAME_SUFFIX.search(key)
    if suffix:
        return CudaFamily(int(suffix["major"]), f"name suffix in {key}")
    for path in record_paths:
        folder = _CU_FOLDER.search(path.replace("\\", "/"))
        if folder:
            return CudaFamily(int(folder["major"]), f"installs into nvidia/cu{folder['major']}/")
    if pins and key in pins:
        return CudaFamily(pins[key], f"pinned by {TOOLKIT_NAME} {pins[key]}.x")
    if key in _VERSIONED_LIKE_CUDA:
        major = _version_major(version)
        if major is not None:
            return CudaFamily(major, f"version {version}")
    return None


def _version_major(version: str) -> int | None:
    try:
        return Version(version).major
    except InvalidVersion:
        return None
