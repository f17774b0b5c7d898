"""Fake environments shaped like the real PyPI torch wheels (requirements copied from their METADATA).

`cu13_site` builds what `pip install torch==2.14.1` leaves (CUDA 13.0: `cuda-toolkit[...]` extras,
suffixed cuDNN/NCCL/cuSPARSELt, the suffix-less toolkit parts in `nvidia/cu13/lib`); tests then
break it the way the seed's story did.
"""

from __future__ import annotations

from dflash_doctor.context import CheckContext
from dflash_doctor.findings import Finding
from dflash_doctor.registry import run_checks
from tests.conftest import env_for
from tests.fakeenv import FakeSite

LINUX = 'platform_system == "Linux"'
TOOLKIT_MARKER = "(sys_platform == 'linux' and platform_machine == 'aarch64' or sys_platform == 'linux' and platform_machine == 'x86_64')"

TORCH_CU13_REQUIRES = [
    "filelock",
    f"cuda-toolkit[cublas,cudart,nvjitlink]==13.0.3; {LINUX}",
    f"nvidia-cudnn-cu13==9.24.0.43; {LINUX}",
    f"nvidia-nccl-cu13==2.30.7; {LINUX}",
    f"triton==3.8.0; {LINUX} and python_version < '3.15'",
    'optree>=0.13.0; extra == "optree"',
]

# cuda-toolkit's own lines: each component only behind its extra (what pip check never reads).
TOOLKIT_REQUIRES = [
    f"nvidia-cublas==13.1.1.3.*; {TOOLKIT_MARKER} and extra == 'cublas'",
    f"nvidia-cuda-runtime==13.0.96.*; {TOOLKIT_MARKER} and extra == 'cudart'",
    f"nvidia-nvjitlink<14,>=13.0.88; {TOOLKIT_MARKER} and extra == 'nvjitlink'",
    f"nvidia-cufft==12.0.0.61.*; {TOOLKIT_MARKER} and extra == 'cufft'",
]


def nccl_files(flavour: str) -> dict[str, bytes]:
    """The twins install the very same paths with different bytes."""
    return {
        "nvidia/nccl/lib/libnccl.so.2": f"libnccl built for {flavour}".encode(),
        "nvidia/nccl/include/nccl.h": f"/* nccl.h {flavour} */".encode(),
    }


def cu13_site(site: FakeSite, triton: str | None = "3.8.0") -> FakeSite:
    """A healthy torch 2.14.1+cu130 tree."""
    site.add_torch(version="2.14.1+cu130", cuda="13.0", requires=TORCH_CU13_REQUIRES)
    site.add_dist("filelock", "3.20.0", {"filelock/__init__.py": b""})
    site.add_dist("cuda-toolkit", "13.0.3.0", requires=TOOLKIT_REQUIRES)
    site.add_dist("nvidia-cublas", "13.1.1.3", {"nvidia/cu13/lib/libcublas.so.13": b"cublas13"})
    site.add_dist("nvidia-cuda-runtime", "13.0.96", {"nvidia/cu13/lib/libcudart.so.13": b"cudart13"})
    site.add_dist("nvidia-nvjitlink", "13.5.37", {"nvidia/cu13/lib/libnvJitLink.so.13": b"nvjitlink"})
    site.add_dist("nvidia-cudnn-cu13", "9.24.0.43", {"nvidia/cudnn/lib/libcudnn.so.9": b"cudnn9"})
    site.add_dist("nvidia-nccl-cu13", "2.30.7", nccl_files("cu13"))
    if triton:
        site.add_dist("triton", triton, {"triton/__init__.py": b""})
    return site


def run(site: FakeSite, *only: str) -> list[Finding]:
    return [f for r in run_checks(CheckContext(env_for(site)), list(only)) for f in r.findings]


def by_id(findings: list[Finding]) -> dict[str, Finding]:
    return {f.id: f for f in findings}
