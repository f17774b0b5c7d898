"""CUDA family of a distribution: suffixes, the nvidia/cu13 folder, toolkit pins; no guessing from sonames."""

from __future__ import annotations

import pytest

from dflash_doctor.env.cuda_family import cuda_family, is_cuda_flavoured, toolkit_pins


@pytest.mark.parametrize(
    ("name", "major"),
    [
        ("nvidia-nccl-cu13", 13),
        ("nvidia_cudnn_cu12", 12),
        ("nvidia-cuda-runtime-cu12", 12),
        ("cupy-cuda12x", 12),
        ("jax-cuda13-plugin", 13),
        ("jax-cuda12-pjrt", 12),
        ("nvidia-dali-cuda120", 12),
    ],
)
def test_name_suffix_tells_the_major(name: str, major: int) -> None:
    family = cuda_family(name, "1.0")
    assert family is not None and family.major == major
    assert "suffix" in family.reason


def test_suffixless_toolkit_part_is_cuda13_by_its_folder_not_its_version() -> None:
    # nvidia-cufft 12.0 ships libcufft.so.12, yet it is a CUDA 13 part: it installs into nvidia/cu13.
    family = cuda_family(
        "nvidia-cufft", "12.0.0.61", ["nvidia/cu13/include/cufft.h", "nvidia/cu13/lib/libcufft.so.12"]
    )
    assert family is not None and family.major == 13
    assert "nvidia/cu13" in family.reason


def test_curand_10_without_record_is_placed_by_the_toolkit_pin() -> None:
    pins = toolkit_pins(
        "13.0.3.0", ["nvidia-curand==10.4.0.35.*; extra == 'curand'", "nvidia-cublas==13.1.1.3.*"]
    )
    family = cuda_family("nvidia-curand", "10.4.0.35", [], pins)
    assert family is not None and family.major == 13
    assert "cuda-toolkit" in family.reason


def test_curand_with_nothing_to_go_on_gets_no_verdict() -> None:
    assert cuda_family("nvidia-curand", "10.4.0.35") is None
    assert cuda_family("nvidia-cusparse", "12.6.3.3") is None


def test_version_major_only_for_names_versioned_like_cuda() -> None:
    toolkit = cuda_family("cuda-toolkit", "13.0.3.0")
    assert toolkit is not None and toolkit.major == 13
    family = cuda_family("nvidia-cublas", "13.1.1.3")
    assert family is not None and family.major == 13
    bindings = cuda_family("cuda-bindings", "12.9.4")
    assert bindings is not None and bindings.major == 12


@pytest.mark.parametrize(
    "name", ["nvidia-ml-py", "cuda-pathfinder", "cuda-core", "numba-cuda", "numpy", "torch"]
)
def test_neutral_or_unrelated_names_get_no_verdict(name: str) -> None:
    # nvidia-ml-py 13.610 is versioned after the driver, not the CUDA major.
    assert cuda_family(name, "13.610.43") is None


def test_cuda_flavoured_names() -> None:
    assert is_cuda_flavoured("nvidia-nccl-cu13")
    assert is_cuda_flavoured("cuda-toolkit")
    assert is_cuda_flavoured("cupy-cuda13x")
    assert not is_cuda_flavoured("nvidia-ml-py")
    assert not is_cuda_flavoured("numpy")
