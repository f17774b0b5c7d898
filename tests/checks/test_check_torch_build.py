"""torch.* findings: each fires on a planted problem and stays quiet on a healthy tree."""

from __future__ import annotations

from dflash_doctor.context import CheckContext
from dflash_doctor.findings import Severity
from dflash_doctor.registry import run_checks
from tests.conftest import env_for
from tests.fakeenv import FakeSite


def findings(*sites: FakeSite) -> dict[str, Severity]:
    runs = run_checks(CheckContext(env_for(*sites)), ["torch"])
    return {f.id: f.severity for r in runs for f in r.findings}


def test_healthy_torch_names_variant_and_commit(site: FakeSite) -> None:
    site.add_torch(version="2.13.0+cpu")
    runs = run_checks(CheckContext(env_for(site)), ["torch"])
    got = {f.id: f for r in runs for f in r.findings}
    assert set(got) == {"torch.build"}
    assert got["torch.build"].evidence["variant"] == "cpu"
    assert "cf30153c4c13" in got["torch.build"].summary


def test_missing_torch_fails(site: FakeSite) -> None:
    site.add_dist("numpy", "2.0.0")
    assert findings(site)["torch.missing"] is Severity.FAIL


def test_half_replaced_install_fails(site: FakeSite) -> None:
    site.add_torch(version="2.13.0")
    (site.root / "torch" / "version.py").write_text("__version__ = '2.11.0+cu130'\ncuda = '13.0'\n")
    assert findings(site)["torch.version_mismatch"] is Severity.FAIL


def test_local_tag_in_dist_info_is_not_a_mismatch(site: FakeSite) -> None:
    site.add_torch(version="2.13.0+cpu")
    meta = next(site.root.glob("torch-*.dist-info")) / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 2.13.0", "Version: 2.13.0+cpu"))
    assert "torch.version_mismatch" not in findings(site)


def test_shadowed_second_torch_warns(tmp_path) -> None:
    user, venv = FakeSite(tmp_path / "user"), FakeSite(tmp_path / "venv")
    user.add_torch(version="2.13.0+cpu")
    venv.add_torch(version="2.11.0+cu130", cuda="13.0")
    assert findings(user, venv)["torch.shadowed"] is Severity.WARN
    assert "torch.shadowed" not in findings(venv)


def test_build_tag_reported(site: FakeSite) -> None:
    site.add_torch(version="2.10.0", cuda="12.8", build="3")
    runs = run_checks(CheckContext(env_for(site)), ["torch"])
    build = next(f for r in runs for f in r.findings if f.id == "torch.build")
    assert build.evidence["wheel_build"] == "3"
    assert build.evidence["variant"] == "cu12x"


def test_shadowed_torch_gets_no_command_that_would_take_the_imported_one(tmp_path) -> None:
    user, venv = FakeSite(tmp_path / "user"), FakeSite(tmp_path / "venv")
    user.add_torch(version="2.13.0+cpu")
    venv.add_torch(version="2.11.0+cu130", cuda="13.0")
    runs = run_checks(CheckContext(env_for(user, venv)), ["torch"])
    shadowed = next(f for r in runs for f in r.findings if f.id == "torch.shadowed")
    assert shadowed.remedy is None and str(venv.root) in shadowed.evidence["fix"]


def test_half_replaced_torch_is_reinstalled_alone(site: FakeSite) -> None:
    site.add_torch(version="2.13.0+cpu")
    meta = next(site.root.glob("torch-*.dist-info")) / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 2.13.0", "Version: 2.12.0"))
    runs = run_checks(CheckContext(env_for(site)), ["torch"])
    found = next(f for r in runs for f in r.findings if f.id == "torch.version_mismatch")
    assert found.remedy == "/fake/bin/python -m pip install --force-reinstall --no-deps torch==2.12.0"
