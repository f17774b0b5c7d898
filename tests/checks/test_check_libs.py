"""libs.* findings: each fires on a planted problem and stays quiet on a healthy tree."""

from __future__ import annotations

import os
from pathlib import Path

from dflash_doctor.context import CheckContext
from dflash_doctor.findings import Finding, Severity
from dflash_doctor.libs.loader import resolve_torch_libraries
from dflash_doctor.registry import run_checks
from tests.conftest import env_for
from tests.fakeenv import FakeSite, build_elf
from tests.libs_fixtures import ALL_PRELOADS, cuda_libs, install_cuda_torch, system_cache

__all__ = ["cuda_libs"]


def run_libs(*sites: FakeSite, llp: str = "", extra_cache: dict[str, str] | None = None) -> list[Finding]:
    env = env_for(*sites, ld_library_path=llp)
    ctx = CheckContext(env)
    ctx.shared("libs.report", lambda: resolve_torch_libraries(env, ldcache=system_cache(extra_cache)))
    return [f for r in run_checks(ctx, ["libs"]) for f in r.findings]


def by_id(findings: list[Finding]) -> dict[str, Finding]:
    return {f.id: f for f in findings}


def severities(findings: list[Finding]) -> set[Severity]:
    return {f.severity for f in findings}


def test_healthy_cuda_tree_is_ok_with_evidence(site: FakeSite, cuda_libs) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    found = run_libs(site)
    assert [f.id for f in found] == ["libs.resolved"] and found[0].severity is Severity.OK
    lines = found[0].evidence["libtorch_cuda.so"]
    assert any(line.startswith("libcudnn.so.9 -> ") and "nvidia-cudnn-cu13" in line for line in lines)
    assert len(lines) == 4


def test_cpu_torch_is_quietly_ok(site: FakeSite, tmp_path: Path, needs_gcc) -> None:
    gomp = build_elf(tmp_path / "b" / "libgomp.so.1", "libgomp.so.1")
    deps = build_elf(
        tmp_path / "b" / "libtorch_global_deps.so",
        "libtorch_global_deps.so",
        ["libgomp.so.1"],
        runpath="$ORIGIN",
    )
    site.add_torch(
        version="2.13.0+cpu",
        extra_files={"torch/lib/libgomp.so.1": gomp, "torch/lib/libtorch_global_deps.so": deps},
    )
    found = by_id(run_libs(site))
    assert set(found) == {"libs.resolved"} and "CPU torch" in found["libs.resolved"].summary


def test_no_torch_skips(site: FakeSite) -> None:
    site.add_dist("numpy", "2.0.0")
    assert by_id(run_libs(site))["libs.resolved"].severity is Severity.SKIP


def test_uninstalled_cudnn_fails_with_pinned_remedy(site: FakeSite, cuda_libs) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS, without=("nvidia-cudnn-cu13",))
    found = by_id(run_libs(site))
    miss = found["libs.missing"]
    assert miss.severity is Severity.FAIL
    assert "ImportError: libcudnn.so.9: cannot open shared object file" in miss.summary
    assert miss.remedy is not None and miss.remedy.endswith("pip install nvidia-cudnn-cu13==9.24.0.43")
    assert "libs.resolved" not in found


def test_toolkit_part_remedy_names_the_extra(site: FakeSite, cuda_libs) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS, without=("nvidia-nvjitlink",))
    miss = by_id(run_libs(site))["libs.missing"]
    assert miss.evidence["soname"] == "libnvJitLink.so.13"
    assert miss.remedy is not None and miss.remedy.endswith("pip install 'cuda-toolkit[nvjitlink]==13.0.3'")


def test_twin_uninstall_left_a_hole(site: FakeSite, cuda_libs) -> None:
    # pip uninstall of the cu12 twin deleted the file the cu13 distribution still lists.
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    os.remove(site.root / "nvidia/nccl/lib/libnccl.so.2")
    miss = by_id(run_libs(site))["libs.missing"]
    assert miss.evidence["soname"] == "libnccl.so.2"
    assert miss.remedy is not None and "nvidia-nccl-cu13==2.30.7" in miss.remedy


def test_lazy_library_missing_names_the_feature(site: FakeSite, cuda_libs) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS, without=("nvidia-cusolver",))
    miss = by_id(run_libs(site))["libs.missing"]
    assert miss.evidence["stage"] == "lazy" and "torch.linalg" in miss.summary


def test_old_nccl_on_ld_library_path_is_outranked_by_rpath(site: FakeSite, cuda_libs, tmp_path: Path) -> None:
    install_cuda_torch(site, cuda_libs, preloads=None)
    old = build_elf(tmp_path / "old" / "libnccl.so.2", "libnccl.so.2", symbol="old_nccl")
    found = run_libs(site, llp=str(old.parent))
    assert severities(found) == {Severity.OK}
    outranked = by_id(found)["libs.resolved"].evidence["ld_library_path_copies_outranked"]
    assert any(str(old) in line for line in outranked)


def test_ld_library_path_wins_a_runpath_lookup(site: FakeSite, cuda_libs, tmp_path: Path) -> None:
    install_cuda_torch(site, cuda_libs, preloads=None)
    old = build_elf(tmp_path / "old" / "libnvJitLink.so.13", "libnvJitLink.so.13", symbol="old_jit")
    shadow = by_id(run_libs(site, llp=str(old.parent)))["libs.shadowed"]
    assert shadow.severity is Severity.WARN
    assert shadow.evidence["loaded"] == str(old) and shadow.remedy == "unset LD_LIBRARY_PATH"
    assert shadow.evidence["would_load_otherwise"].endswith("nvidia/cu13/lib/libnvJitLink.so.13")


def test_preloaded_soname_is_not_shadowed(site: FakeSite, cuda_libs, tmp_path: Path) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    old = build_elf(tmp_path / "old" / "libnvJitLink.so.13", "libnvJitLink.so.13", symbol="old_jit")
    assert severities(run_libs(site, llp=str(old.parent))) == {Severity.OK}


def test_copy_from_earlier_sys_path_entry_warns(tmp_path: Path, cuda_libs) -> None:
    user, venv = FakeSite(tmp_path / "user"), FakeSite(tmp_path / "venv")
    user.add_dist("nvidia-cudnn-cu13", "9.1.0.70", {"nvidia/cudnn/lib/libcudnn.so.9": cuda_libs["cudnn"]})
    install_cuda_torch(venv, cuda_libs, preloads=ALL_PRELOADS)
    outside = by_id(run_libs(user, venv))["libs.outside"]
    assert outside.severity is Severity.WARN and outside.evidence["via"] == "preload"
    assert outside.evidence["path"].startswith(str(user.root))
    assert outside.evidence["torch_copy"].startswith(str(venv.root))


def test_system_copy_used_silently_warns(site: FakeSite, cuda_libs, tmp_path: Path) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS, without=("nvidia-cudnn-cu13",))
    system = build_elf(tmp_path / "usr" / "libcudnn.so.9", "libcudnn.so.9", symbol="system_cudnn")
    found = by_id(run_libs(site, extra_cache={"libcudnn.so.9": str(system)}))
    assert "libs.missing" not in found
    outside = found["libs.outside"]
    assert outside.evidence["via"] == "ld.so.cache" and "nvidia-cudnn-cu13==9.24.0.43" in (
        outside.remedy or ""
    )


def add_extension(site: FakeSite, tmp_path: Path, needs: str) -> None:
    ext = build_elf(tmp_path / "ext" / "_flash.so", None, [needs])
    site.add_dist("flash-attn-like", "2.8.0", {"flash_attn_like/_flash.so": ext})


def test_extension_for_another_cuda_major_fails(site: FakeSite, cuda_libs, tmp_path: Path) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    add_extension(site, tmp_path, "libcudart.so.12")
    foreign = by_id(run_libs(site))["libs.foreign_extension"]
    assert foreign.severity is Severity.FAIL and "libcudart.so.12" in foreign.summary
    assert foreign.evidence["distribution"] == "flash-attn-like"


def test_extension_for_another_cuda_major_that_loads_warns(site: FakeSite, cuda_libs, tmp_path: Path) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    add_extension(site, tmp_path, "libcudart.so.12")
    found = by_id(run_libs(site, extra_cache={"libcudart.so.12": str(cuda_libs["cudart12"])}))
    assert found["libs.foreign_extension"].severity is Severity.WARN


def test_extension_matching_torch_is_quiet(site: FakeSite, cuda_libs, tmp_path: Path) -> None:
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    add_extension(site, tmp_path, "libcudart.so.13")
    assert severities(run_libs(site)) == {Severity.OK}
