"""`dflash-doctor why`: load-bearing or not, for whom, and what the loader falls back to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_doctor import cli
from dflash_doctor.env.environment import Environment
from dflash_doctor.libs.why import explain_package
from tests.conftest import env_for
from tests.fakeenv import FakeSite, build_elf
from tests.libs_fixtures import ALL_PRELOADS, cuda_libs, install_cuda_torch, system_cache

__all__ = ["cuda_libs"]


def test_cudnn_is_load_bearing(site: FakeSite, cuda_libs) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    expl = explain_package(env_for(site), "nvidia-cudnn-cu13", ldcache=system_cache())
    assert expl.load_bearing
    assert expl.import_error_without == (
        "ImportError: libcudnn.so.9: cannot open shared object file: No such file or directory"
    )
    (lib,) = expl.libraries
    assert lib.soname == "libcudnn.so.9" and lib.loaded and lib.without == "missing"
    assert "libtorch_cuda.so" in lib.needed_by
    assert any(line.startswith("torch 2.14.1: nvidia-cudnn-cu13==9.24.0.43") for line in expl.required_by)
    # the what-if did not touch the files
    assert (site.root / "nvidia/cudnn/lib/libcudnn.so.9").exists()


def test_fallback_to_a_system_copy_is_not_load_bearing(site: FakeSite, cuda_libs, tmp_path: Path) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    system = build_elf(tmp_path / "usr" / "libcudnn.so.9", "libcudnn.so.9", symbol="system_cudnn")
    expl = explain_package(
        env_for(site), "nvidia-cudnn-cu13", ldcache=system_cache({"libcudnn.so.9": str(system)})
    )
    assert not expl.load_bearing
    assert expl.libraries[0].without == str(system) and expl.libraries[0].without_via == "ld.so.cache"
    assert str(system) in expl.verdict


def test_twin_claiming_the_same_file_is_named(site: FakeSite, cuda_libs) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    site.add_dist("nvidia-nccl-cu12", "2.21.5", {"nvidia/nccl/lib/libnccl.so.2": cuda_libs["nccl"]})
    expl = explain_package(env_for(site), "nvidia-nccl-cu13", ldcache=system_cache())
    assert expl.libraries[0].other_owners == ("nvidia-nccl-cu12",)
    assert expl.load_bearing  # hiding the shared path hides it for both owners


def test_package_without_libraries(site: FakeSite, cuda_libs) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    site.add_dist("filelock", "3.16.0", {"filelock/__init__.py": b""})
    expl = explain_package(env_for(site), "filelock", ldcache=system_cache())
    assert not expl.load_bearing and expl.verdict == "provides no shared libraries"


def test_cli_json_and_unknown_package(site: FakeSite, cuda_libs, monkeypatch, capsys) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    monkeypatch.setattr(Environment, "load", classmethod(lambda cls, python=None: env_for(site)))
    assert cli.run(["why", "nvidia-cudnn-cu13", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "dflash-doctor/why/v1" and data["load_bearing"] is True
    assert cli.run(["why", "nvidia-cudnn-cu13"]) == 0
    assert "load-bearing" in capsys.readouterr().out
    assert cli.run(["why", "no-such-package"]) == 2
    assert "no distribution named 'no-such-package'" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["nvidia_cudnn_cu13", "NVIDIA-cuDNN-cu13"])
def test_names_are_normalised(site: FakeSite, cuda_libs, name: str) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    assert explain_package(env_for(site), name, ldcache=system_cache()).name == "nvidia-cudnn-cu13"
