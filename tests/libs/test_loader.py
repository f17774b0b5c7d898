"""The loader simulation follows glibc's order on both sides of every rule (hermetic ELF fixtures)."""

from __future__ import annotations

import os
from pathlib import Path

from dflash_doctor.libs.loader import LibraryReport, resolve_torch_libraries
from dflash_doctor.libs.preload import DOCUMENTED_PLAN, parse_preload_plan
from tests.conftest import env_for
from tests.fakeenv import FakeSite, build_elf
from tests.libs_fixtures import ALL_PRELOADS, compare_with_maps, cuda_libs, install_cuda_torch, system_cache

__all__ = ["cuda_libs"]


def resolve(
    *sites: FakeSite, llp: str = "", extra_cache: dict[str, str] | None = None, hidden=None
) -> LibraryReport:
    return resolve_torch_libraries(
        env_for(*sites), ld_library_path=llp, ldcache=system_cache(extra_cache), hidden=hidden
    )


def older_copy(tmp_path: Path, soname: str) -> Path:
    """A different file with the same soname, in a folder meant for LD_LIBRARY_PATH."""
    return build_elf(tmp_path / "old-toolkit" / soname, soname, symbol="older_copy")


def test_healthy_tree_resolves_inside_torch_site(site: FakeSite, cuda_libs) -> None:
    install_cuda_torch(site, cuda_libs, preloads=None)
    report = resolve(site)
    assert report.import_error is None and report.missing() == []
    nccl = report.effective("libnccl.so.2")
    assert nccl is not None and nccl.via == "rpath"
    assert nccl.path == os.path.normpath(site.root / "nvidia/nccl/lib/libnccl.so.2")  # $ORIGIN/../.. expanded
    assert nccl.owners == ("nvidia-nccl-cu13",)
    assert [r.soname for r in report.cuda_sonames_of("libtorch_cuda.so")] == [
        "libcudart.so.13",
        "libcusparse.so.12",
        "libnccl.so.2",
        "libcudnn.so.9",
    ]


def test_rpath_beats_ld_library_path(site: FakeSite, cuda_libs, tmp_path: Path) -> None:
    install_cuda_torch(site, cuda_libs, preloads=None)
    old = older_copy(tmp_path, "libnccl.so.2")
    nccl = resolve(site, llp=str(old.parent)).effective("libnccl.so.2")
    assert nccl is not None and nccl.via == "rpath"
    assert nccl.path == os.path.normpath(site.root / "nvidia/nccl/lib/libnccl.so.2")


def test_runpath_loses_to_ld_library_path(site: FakeSite, cuda_libs, tmp_path: Path) -> None:
    install_cuda_torch(site, cuda_libs, preloads=None)
    old = older_copy(tmp_path, "libnvJitLink.so.13")
    jit = resolve(site, llp=str(old.parent)).effective("libnvJitLink.so.13")
    assert jit is not None and jit.via == "ld_library_path" and jit.path == str(old)
    assert jit.requester.endswith("libcusparse.so.12")


def test_preload_satisfies_later_lookups(site: FakeSite, cuda_libs, tmp_path: Path) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    old = older_copy(tmp_path, "libnvJitLink.so.13")
    report = resolve(site, llp=str(old.parent))
    jit = report.effective("libnvJitLink.so.13")
    assert jit is not None and jit.via == "preload" and jit.requester == "torch/__init__.py"
    from_cusparse = [r for r in report.needed_by("libcusparse.so.12") if r.soname == "libnvJitLink.so.13"]
    assert [r.via for r in from_cusparse] == ["loaded"]
    assert str(old) not in report.loaded_paths.values()


def test_loader_chain_rpath_ignored_when_object_has_runpath(
    site: FakeSite, cuda_libs, tmp_path: Path
) -> None:
    # libnvJitLink lives only in nvidia/nvjitlink/lib, a folder on libtorch_cuda's RPATH.
    install_cuda_torch(site, cuda_libs, preloads=None, without=("nvidia-nvjitlink",))
    site.add_dist(
        "nvidia-nvjitlink", "13.0.88", {"nvidia/nvjitlink/lib/libnvJitLink.so.13": cuda_libs["nvjitlink"]}
    )
    report = resolve(site)
    miss = [r for r in report.missing() if r.soname == "libnvJitLink.so.13"]
    assert miss and miss[0].requester.endswith("libcusparse.so.12")  # RUNPATH object: chain not searched
    assert (
        report.import_error
        == "ImportError: libnvJitLink.so.13: cannot open shared object file: No such file or directory"
    )


def test_loader_chain_rpath_used_when_object_has_no_runpath(
    site: FakeSite, cuda_libs, tmp_path: Path
) -> None:
    no_runpath = build_elf(tmp_path / "b" / "libcusparse.so.12", "libcusparse.so.12", ["libnvJitLink.so.13"])
    install_cuda_torch(site, cuda_libs, preloads=None, without=("nvidia-nvjitlink", "nvidia-cusparse"))
    site.add_dist(
        "nvidia-nvjitlink", "13.0.88", {"nvidia/nvjitlink/lib/libnvJitLink.so.13": cuda_libs["nvjitlink"]}
    )
    site.add_dist("nvidia-cusparse", "12.6.3.3", {"nvidia/cu13/lib/libcusparse.so.12": no_runpath})
    jit = resolve(site).effective("libnvJitLink.so.13")
    assert jit is not None and jit.via == "rpath" and "/nvidia/nvjitlink/lib/" in (jit.path or "")


def test_missing_provider_is_an_import_error(site: FakeSite, cuda_libs) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS, without=("nvidia-cudnn-cu13",))
    report = resolve(site)
    assert (
        report.import_error
        == "ImportError: libcudnn.so.9: cannot open shared object file: No such file or directory"
    )
    miss = report.missing()[0]
    assert miss.soname == "libcudnn.so.9" and miss.requester.endswith("libtorch_cuda.so")
    assert any(p.endswith("nvidia/cudnn/lib") for p in miss.searched)


def test_system_copy_from_ld_so_cache(site: FakeSite, cuda_libs, tmp_path: Path) -> None:
    install_cuda_torch(site, cuda_libs, preloads=None, without=("nvidia-cudnn-cu13",))
    system = older_copy(tmp_path, "libcudnn.so.9")
    cudnn = resolve(site, extra_cache={"libcudnn.so.9": str(system)}).effective("libcudnn.so.9")
    assert cudnn is not None and cudnn.via == "ld.so.cache" and cudnn.path == str(system)


def test_preload_takes_first_sys_path_entry(tmp_path: Path, cuda_libs) -> None:
    user, venv = FakeSite(tmp_path / "user"), FakeSite(tmp_path / "venv")
    user.add_dist("nvidia-cudnn-cu13", "9.1.0.70", {"nvidia/cudnn/lib/libcudnn.so.9": cuda_libs["cudnn"]})
    install_cuda_torch(venv, cuda_libs, preloads=ALL_PRELOADS)
    cudnn = resolve(user, venv).effective("libcudnn.so.9")
    assert cudnn is not None and cudnn.via == "preload"
    assert cudnn.path == os.path.normpath(user.root / "nvidia/cudnn/lib/libcudnn.so.9")
    # Without the preload, torch's RPATH picks its own copy.
    venv_only = FakeSite(tmp_path / "v2")
    install_cuda_torch(venv_only, cuda_libs, preloads=None)
    rpath = resolve(user, venv_only).effective("libcudnn.so.9")
    assert rpath is not None and rpath.via == "rpath" and str(venv_only.root) in (rpath.path or "")


def test_lazy_libraries_resolved_after_import(site: FakeSite, cuda_libs) -> None:
    install_cuda_torch(site, cuda_libs, preloads=None, without=("nvidia-cusolver",))
    report = resolve(site)
    assert report.import_error is None
    assert [(r.soname, r.stage) for r in report.missing()] == [("libcusolver.so.12", "lazy")]


def test_hidden_files_are_a_what_if(site: FakeSite, cuda_libs) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    nccl = os.path.normpath(site.root / "nvidia/nccl/lib/libnccl.so.2")
    report = resolve(site, hidden=lambda p: p == nccl)
    assert report.import_error is not None and "libnccl.so.2" in report.import_error
    assert os.path.exists(nccl)


def test_compare_with_maps(site: FakeSite, cuda_libs) -> None:
    install_cuda_torch(site, cuda_libs, preloads=None)
    report = resolve(site)
    predicted = [r.path for r in report.resolutions if r.stage == "import" and r.path and r.via != "loaded"]
    assert compare_with_maps(report, predicted).agrees
    stray = str(site.root / "nvidia/cu13/lib/libextra.so.1")
    result = compare_with_maps(report, [*predicted[1:], stray])
    assert result.predicted_not_mapped == (os.path.realpath(predicted[0]),)
    assert result.mapped_not_predicted == (os.path.realpath(stray),)


def test_preload_plan_parsed_from_source() -> None:
    new = parse_preload_plan(
        'def _get_cuda_dep_paths(p, f, n):\n    x = f"cu{m}"\n'
        "def _preload_cuda_deps(err=None, required=True):\n"
        "    cuda_libs = [('cublas', 'libcublasLt.so.*[0-9]'), ('nccl', 'libnccl.so.*[0-9]')]\n"
        "    _preload_cuda_lib('nvtx', 'libnvToolsExt.so.*[0-9]', required=False)\n"
        "def _load_global_deps():\n    try:\n        _preload_cuda_deps(required=False)\n"
        "    except OSError as err:\n        _preload_cuda_deps(err)\n"
    )
    assert new is not None and new.on_success and new.cu_major_folder
    assert new.success_path_libs[-1] == ("nvtx", "libnvToolsExt.so.*[0-9]")
    old = parse_preload_plan(
        "def _preload_cuda_deps(lib_folder, lib_name):\n    pass\n"
        "def _load_global_deps():\n"
        "    cuda_libs = {'cublas': 'libcublas.so.*[0-9]', 'cudnn': 'libcudnn.so.*[0-9]'}\n"
        "    try:\n        _preload_cuda_deps('nvjitlink', 'libnvJitLink.so.*[0-9]')\n"
        "    except OSError as err:\n        pass\n"
    )
    assert old is not None and not old.cu_major_folder
    assert old.libs == (("cublas", "libcublas.so.*[0-9]"), ("cudnn", "libcudnn.so.*[0-9]"))
    assert old.success_path_libs == (("nvjitlink", "libnvJitLink.so.*[0-9]"),)
    assert parse_preload_plan("x = 1\n") is None
    assert ("cudnn", "libcudnn.so.*[0-9]") in DOCUMENTED_PLAN.libs
