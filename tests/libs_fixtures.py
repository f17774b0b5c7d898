"""A small fake CUDA 13 torch built from real gcc ELF files, shaped like the real wheel.

torch/lib objects carry DT_RPATH into `nvidia/*/lib` (as the real wheel does); libcusparse carries
RUNPATH `$ORIGIN` and needs libnvJitLink (as CUDA 13.0's does); libcudnn carries RPATH `$ORIGIN`.
The ELF files are built once per session and copied into each test's fake site-packages.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from dflash_doctor.libs.ldcache import LdCache, load_system_cache
from dflash_doctor.libs.loader import LibraryReport
from tests.fakeenv import HAVE_GCC, FakeSite, build_elf

TORCH_RPATH = (
    "$ORIGIN/../../nvidia/cudnn/lib:$ORIGIN/../../nvidia/nccl/lib:$ORIGIN/../../nvidia/nvjitlink/lib"
    ":$ORIGIN/../../nvidia/cu13/lib:$ORIGIN"
)
TORCH_REQUIRES = [
    'cuda-toolkit[cudart,cusolver,cusparse,nvjitlink]==13.0.3; platform_system == "Linux"',
    'nvidia-cudnn-cu13==9.24.0.43; platform_system == "Linux"',
    'nvidia-nccl-cu13==2.30.7; platform_system == "Linux"',
]


def build_cuda_libs(out: Path) -> dict[str, Path]:
    """Every ELF of the fake tree, by short name."""
    return {
        "global_deps": build_elf(
            out / "libtorch_global_deps.so", "libtorch_global_deps.so", ["libcudart.so.13"], rpath=TORCH_RPATH
        ),
        "_C": build_elf(out / "_C.so", None, ["libtorch_python.so"], rpath="$ORIGIN/lib"),
        "python": build_elf(
            out / "libtorch_python.so", "libtorch_python.so", ["libtorch_cuda.so"], rpath=TORCH_RPATH
        ),
        "cuda": build_elf(
            out / "libtorch_cuda.so",
            "libtorch_cuda.so",
            ["libcudart.so.13", "libcusparse.so.12", "libnccl.so.2", "libcudnn.so.9"],
            rpath=TORCH_RPATH,
        ),
        "linalg": build_elf(
            out / "libtorch_cuda_linalg.so",
            "libtorch_cuda_linalg.so",
            ["libcusolver.so.12"],
            rpath=TORCH_RPATH,
        ),
        "cudart": build_elf(out / "libcudart.so.13", "libcudart.so.13"),
        "cusparse": build_elf(
            out / "libcusparse.so.12", "libcusparse.so.12", ["libnvJitLink.so.13"], runpath="$ORIGIN"
        ),
        "nvjitlink": build_elf(out / "libnvJitLink.so.13", "libnvJitLink.so.13"),
        "cusolver": build_elf(out / "libcusolver.so.12", "libcusolver.so.12", runpath="$ORIGIN"),
        "cudnn": build_elf(out / "libcudnn.so.9", "libcudnn.so.9", rpath="$ORIGIN"),
        "nccl": build_elf(out / "libnccl.so.2", "libnccl.so.2"),
        "cudart12": build_elf(out / "libcudart.so.12", "libcudart.so.12"),
    }


# Written as torch/__init__.py: the parts the preload reader looks at, preloading `libs` on success.
def torch_init(libs: list[tuple[str, str]] | None) -> str:
    body = "        _preload_cuda_deps(required=False)\n" if libs else "        pass\n"
    return (
        "def _get_cuda_dep_paths(path, lib_folder, lib_name):\n"
        '    return glob.glob(os.path.join(path, "nvidia", f"cu{maj}", "lib", lib_name))\n'
        "\n"
        "def _preload_cuda_deps(err=None, required=True):\n"
        f"    cuda_libs = {list(libs or [('cudnn', 'libcudnn.so.*[0-9]')])!r}\n"
        "    for lib_folder, lib_name in cuda_libs:\n"
        "        _preload_cuda_lib(lib_folder, lib_name, required=required)\n"
        "\n"
        "def _load_global_deps():\n"
        "    try:\n"
        "        ctypes.CDLL(global_deps_lib_path, mode=ctypes.RTLD_GLOBAL)\n"
        f"{body}"
        "    except OSError as err:\n"
        "        _preload_cuda_deps(err)\n"
        "\n"
        "x = 1\n"
    )


ALL_PRELOADS = [
    ("cudnn", "libcudnn.so.*[0-9]"),
    ("cuda_runtime", "libcudart.so.*[0-9]"),
    ("nvjitlink", "libnvJitLink.so.*[0-9]"),
    ("cusparse", "libcusparse.so.*[0-9]"),
    ("cusolver", "libcusolver.so.*[0-9]"),
    ("nccl", "libnccl.so.*[0-9]"),
]


def install_cuda_torch(
    site: FakeSite,
    libs: dict[str, Path],
    preloads: list[tuple[str, str]] | None = None,
    without: tuple[str, ...] = (),
) -> None:
    """A cu130 torch and its NVIDIA distributions; `without` leaves distributions out."""
    site.add_torch(
        version="2.14.1+cu130",
        cuda="13.0",
        requires=TORCH_REQUIRES,
        extra_files={
            "torch/__init__.py": torch_init(preloads).encode(),
            "torch/_C.cpython-311-x86_64-linux-gnu.so": libs["_C"],
            "torch/lib/libtorch_global_deps.so": libs["global_deps"],
            "torch/lib/libtorch_python.so": libs["python"],
            "torch/lib/libtorch_cuda.so": libs["cuda"],
            "torch/lib/libtorch_cuda_linalg.so": libs["linalg"],
        },
    )
    nvidia = {
        "nvidia-cuda-runtime": ("13.0.96", {"nvidia/cu13/lib/libcudart.so.13": libs["cudart"]}),
        "nvidia-cusparse": ("12.6.3.3", {"nvidia/cu13/lib/libcusparse.so.12": libs["cusparse"]}),
        "nvidia-nvjitlink": ("13.0.88", {"nvidia/cu13/lib/libnvJitLink.so.13": libs["nvjitlink"]}),
        "nvidia-cusolver": ("12.0.4.66", {"nvidia/cu13/lib/libcusolver.so.12": libs["cusolver"]}),
        "nvidia-cudnn-cu13": ("9.24.0.43", {"nvidia/cudnn/lib/libcudnn.so.9": libs["cudnn"]}),
        "nvidia-nccl-cu13": ("2.30.7", {"nvidia/nccl/lib/libnccl.so.2": libs["nccl"]}),
    }
    for name, (version, files) in nvidia.items():
        if name not in without:
            site.add_dist(name, version, files)


def system_cache(extra: dict[str, str] | None = None) -> LdCache:
    """The host's ld.so.cache (for libc and friends) without any CUDA library, plus `extra`."""
    real = load_system_cache()
    entries = {
        k: v for k, v in real.entries.items() if not k.startswith(("libcud", "libnccl", "libcu", "libnv"))
    }
    entries.update(extra or {})
    return LdCache(entries, default_dirs=(), source="test cache")


@pytest.fixture(scope="session")
def cuda_libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The fake tree's ELF files, compiled once per test session."""
    if not HAVE_GCC:
        pytest.skip("gcc is needed to build ELF fixtures")
    return build_cuda_libs(tmp_path_factory.mktemp("cuda-libs"))


# The slow real-wheel tests' oracle: the simulation against what a real `import torch` mapped.
@dataclass(frozen=True)
class MapsComparison:
    """The static model against a real process's `/proc/self/maps` after `import torch`.

    ``predicted_not_mapped``: files the model says `import torch` loads that the process did not map.
    ``mapped_not_predicted``: files the process mapped from torch's site-packages tree that the
    model did not predict. Both empty means the model agrees with the loader.
    """

    agreed: tuple[str, ...]
    predicted_not_mapped: tuple[str, ...]
    mapped_not_predicted: tuple[str, ...]

    @property
    def agrees(self) -> bool:
        return not self.predicted_not_mapped and not self.mapped_not_predicted


def compare_with_maps(report: LibraryReport, mapped_paths: Iterable[str]) -> MapsComparison:
    """Compare the import-stage files of `report` with the paths a real process mapped."""
    mapped = {os.path.realpath(p) for p in mapped_paths}
    predicted = {
        os.path.realpath(r.path)
        for r in report.resolutions
        if r.stage == "import" and r.path is not None and r.via != "loaded"
    }
    site = (report.site_dir or "/nonexistent").rstrip(os.sep) + os.sep
    site_real = os.path.realpath(site.rstrip(os.sep)) + os.sep
    ours = {
        p
        for p in mapped
        if p.startswith(site_real) and ("/torch/lib/" in p or "/nvidia/" in p or "/torch/_C" in p)
    }
    return MapsComparison(
        agreed=tuple(sorted(predicted & mapped)),
        predicted_not_mapped=tuple(sorted(predicted - mapped)),
        mapped_not_predicted=tuple(sorted(ours - predicted)),
    )
