"""Remedies are promises (issue 19): pasteable without a terminal, pinned, deduplicated across findings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dflash_doctor.context import CheckContext
from dflash_doctor.env.pip_commands import install_command, pinned, reinstall_command, uninstall_command
from dflash_doctor.findings import Finding, Severity
from dflash_doctor.libs.loader import resolve_torch_libraries
from dflash_doctor.registry import CheckRun, one_command_per_remedy, run_checks
from tests.conftest import env_for
from tests.fakeenv import FakeSite
from tests.libs_fixtures import ALL_PRELOADS, cuda_libs, install_cuda_torch, system_cache  # noqa: F401


@pytest.fixture(autouse=True)
def hermetic_hash_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_DOCTOR_CACHE_DIR", str(tmp_path / "hash-cache"))


def test_pip_commands_never_prompt_and_never_move_other_packages(site: FakeSite) -> None:
    site.add_torch()
    env = env_for(site)
    assert uninstall_command(env, "a", "b") == "/fake/bin/python -m pip uninstall -y a b"
    assert (
        reinstall_command(env, "a==1") == "/fake/bin/python -m pip install --force-reinstall --no-deps a==1"
    )
    assert install_command(env, "a==1") == "/fake/bin/python -m pip install a==1"


def test_uv_uninstall_has_no_y_flag(site: FakeSite) -> None:
    site.add_torch()
    (next(site.root.glob("torch-*.dist-info")) / "INSTALLER").write_text("uv\n")
    assert uninstall_command(env_for(site), "a") == "uv pip uninstall --python /fake/bin/python a"


def test_a_range_pin_keeps_the_installed_version_that_meets_it() -> None:
    from packaging.requirements import Requirement

    req = Requirement("nvidia-cublas==13.1.1.3.*")
    assert pinned("nvidia-cublas", req, "13.1.1.3") == "nvidia-cublas==13.1.1.3"
    assert pinned("nvidia-cublas", req, "13.2.0.1") == "'nvidia-cublas==13.1.1.3.*'"
    assert pinned("nvidia-cublas", req, "not a version") == "'nvidia-cublas==13.1.1.3.*'"


def test_the_same_command_from_two_findings_is_printed_once() -> None:
    from dflash_doctor.registry import Check

    def fake(check_id: str) -> Check:
        return Check(check_id, check_id, lambda ctx: iter(()))

    runs = [
        CheckRun(fake("libs"), [Finding("libs.missing", Severity.FAIL, "x", {}, "pip install a")], 0.0),
        CheckRun(
            fake("ownership"),
            [
                Finding("ownership.missing_files", Severity.FAIL, "y", {"count": 1}, "pip install a"),
                Finding("ownership.clobbered", Severity.FAIL, "z", {}, "pip install b"),
            ],
            0.0,
        ),
    ]
    got = [f for r in one_command_per_remedy(runs) for f in r.findings]
    assert [f.remedy for f in got] == ["pip install a", None, "pip install b"]
    assert got[1].evidence == {"count": 1, "remedy": "the same command as libs.missing"}


def test_a_deleted_library_gets_one_reinstall_not_two(site: FakeSite, cuda_libs) -> None:  # noqa: F811
    """Issue 19 F: `libs.missing` and `ownership.missing_files` printed the same reinstall twice."""
    install_cuda_torch(site, cuda_libs, preloads=ALL_PRELOADS)
    os.remove(site.root / "nvidia/nccl/lib/libnccl.so.2")
    env = env_for(site)
    ctx = CheckContext(env)
    ctx.shared("libs.report", lambda: resolve_torch_libraries(env, ldcache=system_cache()))
    findings = [f for r in run_checks(ctx, ["libs", "ownership"]) for f in r.findings]
    remedies = [f.remedy for f in findings if f.remedy]
    assert remedies == [
        "/fake/bin/python -m pip install --force-reinstall --no-deps nvidia-nccl-cu13==2.30.7"
    ]
    second = next(f for f in findings if f.id == "ownership.missing_files")
    assert (
        second.severity is Severity.FAIL and second.evidence["remedy"] == "the same command as libs.missing"
    )
