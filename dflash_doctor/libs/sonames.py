"""What a soname is: a CUDA library, the NVIDIA driver, or something else; and who ships it on PyPI.

Soname majors do not tell the CUDA major (`libcusparse.so.12` ships in CUDA 13), except for the
few libraries whose soname follows the toolkit (`libcudart.so.13`): `cuda_major_of` knows which.
`provider_candidates` maps a soname to the pip distributions that ship it for one CUDA major, so a
remedy can name the package even after `pip uninstall` removed every trace of it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from packaging.utils import canonicalize_name

if TYPE_CHECKING:
    from packaging.requirements import Requirement

# Stems of the CUDA user-space libraries torch and its extensions link (not the driver).
_CUDA_SONAME = re.compile(
    r"^(libcudart|libcublas|libcublasLt|libcudnn(_\w+)?|libnccl|libcusparse|libcusparseLt|libcufft|libcufftw"
    r"|libcurand|libcusolver|libcusolverMg|libnvrtc|libnvrtc-builtins|libnvJitLink|libcupti|libcufile"
    r"|libcufile_rdma|libnvshmem_host|libnvToolsExt|libnvtx3interop|libnpp\w*|libnvjpeg|libnvfatbin)\.so(\.|$)"
)
# The driver comes with the NVIDIA kernel module, never from pip; it is the gpu checks' business.
_DRIVER_SONAME = re.compile(r"^(libcuda|libnvidia-[\w-]+|libnvcuvid|libcudadebugger)\.so(\.|$)")
# Libraries whose soname major is the CUDA toolkit major.
_TOOLKIT_MAJOR = re.compile(r"^(libcudart|libcublas|libcublasLt|libnvrtc|libnvJitLink|libcupti)\.so\.(\d+)$")

# soname stem -> (CUDA 13 toolkit distribution, cuda-toolkit extra). CUDA 12 uses `<name>-cu12`.
_TOOLKIT_PROVIDERS: dict[str, tuple[str, str]] = {
    "libcublas": ("nvidia-cublas", "cublas"),
    "libcublasLt": ("nvidia-cublas", "cublas"),
    "libcudart": ("nvidia-cuda-runtime", "cudart"),
    "libcufft": ("nvidia-cufft", "cufft"),
    "libcufftw": ("nvidia-cufft", "cufft"),
    "libcufile": ("nvidia-cufile", "cufile"),
    "libcufile_rdma": ("nvidia-cufile", "cufile"),
    "libcupti": ("nvidia-cuda-cupti", "cupti"),
    "libcurand": ("nvidia-curand", "curand"),
    "libcusolver": ("nvidia-cusolver", "cusolver"),
    "libcusolverMg": ("nvidia-cusolver", "cusolver"),
    "libcusparse": ("nvidia-cusparse", "cusparse"),
    "libnvJitLink": ("nvidia-nvjitlink", "nvjitlink"),
    "libnvrtc": ("nvidia-cuda-nvrtc", "nvrtc"),
    "libnvrtc-builtins": ("nvidia-cuda-nvrtc", "nvrtc"),
    "libnvToolsExt": ("nvidia-nvtx", "nvtx"),
    "libnvtx3interop": ("nvidia-nvtx", "nvtx"),
}
# Libraries that keep a `-cu<major>` suffix in every CUDA generation.
_SUFFIXED_PROVIDERS: dict[str, str] = {
    "libcudnn": "nvidia-cudnn",
    "libnccl": "nvidia-nccl",
    "libcusparseLt": "nvidia-cusparselt",
    "libnvshmem_host": "nvidia-nvshmem",
}


def stem(soname: str) -> str:
    """`libcudnn_ops.so.9` -> `libcudnn_ops`."""
    return soname.split(".so", 1)[0]


def is_cuda_soname(soname: str) -> bool:
    return bool(_CUDA_SONAME.match(soname))


def is_driver_soname(soname: str) -> bool:
    return bool(_DRIVER_SONAME.match(soname))


def cuda_major_of(soname: str) -> int | None:
    """The CUDA major a soname implies, for the libraries whose soname tracks the toolkit."""
    match = _TOOLKIT_MAJOR.match(soname)
    return int(match.group(2)) if match else None


def provider_candidates(soname: str, cuda_major: int | None) -> list[tuple[str, str | None]]:
    """(distribution, cuda-toolkit extra or None) that ship `soname` for this CUDA major."""
    if cuda_major is None:
        return []
    name = stem(soname)
    if name.startswith("libcudnn"):
        name = "libcudnn"
    if name in _SUFFIXED_PROVIDERS:
        return [(f"{_SUFFIXED_PROVIDERS[name]}-cu{cuda_major}", None)]
    if name in _TOOLKIT_PROVIDERS:
        dist, extra = _TOOLKIT_PROVIDERS[name]
        if cuda_major >= 13:
            return [(dist, extra)]
        return [(f"{dist}-cu{cuda_major}", None)]
    return []


def requirement_for(soname: str, cuda_major: int | None, requires: list[Requirement]) -> str | None:
    """The pip requirement (from torch's own Requires-Dist) that brings `soname`, pinned as torch pins it.

    `nvidia-cudnn-cu13==9.24.0.43`, or for the CUDA 13 toolkit parts that torch pulls in through
    extras: `cuda-toolkit[cublas]==13.0.3`. None when torch does not require a provider.
    """
    for dist, extra in provider_candidates(soname, cuda_major):
        for req in requires:
            if canonicalize_name(req.name) == canonicalize_name(dist):
                return f"{req.name}{req.specifier}"
        if extra is None:
            continue
        for req in requires:
            if extra in req.extras:
                return f"{req.name}[{extra}]{req.specifier}"
    return None
