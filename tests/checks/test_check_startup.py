"""startup.bytecode: fires for each reason bytecode is never written, stays quiet when it is there or will be."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from dflash_doctor.context import CheckContext
from dflash_doctor.env import bytecode
from dflash_doctor.env.bytecode import (
    BytecodeSettings,
    bytecode_path,
    cache_tag_of,
    optimization_level,
    sample_package,
    settings_for,
)
from dflash_doctor.env.interpreter import probe_interpreter
from dflash_doctor.findings import Finding, Severity
from dflash_doctor.registry import run_checks
from tests.conftest import env_for
from tests.fakeenv import FakeSite, make_venv

TAG = "cpython-311"  # env_for's interpreter is 3.11.7 and carries no probed cache tag
TORCH_MODULES = {
    "torch/functional.py": b"",
    "torch/nn/__init__.py": b"",
    "torch/nn/modules.py": b"",
    "torch/include/ATen.h": b"",  # not a package: never sampled
}
BYTECODE_VARIABLES = ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX", "PYTHONOPTIMIZE")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """This machine runs with PYTHONDONTWRITEBYTECODE=1: each test states the variables it means."""
    for name in BYTECODE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def torch_site(site: FakeSite) -> FakeSite:
    site.add_torch(extra_files=TORCH_MODULES)
    return site


def sources(folder: Path) -> Iterator[Path]:
    """The modules the check samples: the package folder's and its direct sub-packages'."""
    yield from folder.glob("*.py")
    for sub in folder.iterdir():
        if (sub / "__init__.py").is_file():
            yield from sub.glob("*.py")


def compile_beside(folder: Path, tag: str = TAG, suffix: str = "") -> None:
    """What pip's install-time compile leaves: `__pycache__/<stem>.<tag>.pyc` beside each source."""
    for source in sources(folder):
        pyc = source.parent / "__pycache__" / f"{source.stem}.{tag}{suffix}.pyc"
        pyc.parent.mkdir(exist_ok=True)
        pyc.write_bytes(b"")


def compile_under_prefix(folder: Path, prefix: Path) -> None:
    for source in sources(folder):
        pyc = prefix / str(source.parent).lstrip(os.sep) / f"{source.stem}.{TAG}.pyc"
        pyc.parent.mkdir(parents=True, exist_ok=True)
        pyc.write_bytes(b"")


def the_finding(site: FakeSite) -> Finding:
    runs = run_checks(CheckContext(env_for(site)), ["startup"])
    found = [f for r in runs for f in r.findings]
    assert [f.id for f in found] == ["startup.bytecode"]
    return found[0]


def test_quiet_when_bytecode_is_cached(torch_site: FakeSite) -> None:
    compile_beside(torch_site.root / "torch")
    finding = the_finding(torch_site)
    assert finding.severity is Severity.OK
    assert finding.summary == "bytecode cached for torch"
    assert finding.evidence["packages"] == {"torch": "all 5 sampled modules have cached bytecode"}
    assert finding.evidence["cache_tag"] == TAG


def test_dont_write_bytecode_fires(torch_site: FakeSite, clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("PYTHONDONTWRITEBYTECODE", "1")
    finding = the_finding(torch_site)
    assert finding.severity is Severity.WARN
    assert finding.evidence["packages"]["torch"] == "5 of 5 sampled modules have no cached bytecode"
    assert finding.evidence["causes"]["torch"] == [
        "PYTHONDONTWRITEBYTECODE=1 is set: Python reads .pyc files but writes none"
    ]
    assert "PYTHONDONTWRITEBYTECODE=1 is set" in finding.summary
    assert "torchrun starts one per GPU" in finding.summary
    assert finding.evidence["looked_for"]["torch"] == str(
        torch_site.root / "torch" / "__pycache__" / f"__init__.{TAG}.pyc"
    )
    assert "read even while PYTHONDONTWRITEBYTECODE is set" in (finding.remedy or "")
    assert "unset PYTHONDONTWRITEBYTECODE" in (finding.remedy or "")


def test_empty_dont_write_bytecode_counts_as_unset(
    torch_site: FakeSite, clean_env: pytest.MonkeyPatch
) -> None:
    clean_env.setenv("PYTHONDONTWRITEBYTECODE", "")  # CPython: only a non-empty value turns it on
    assert the_finding(torch_site).severity is Severity.OK


def test_missing_but_writable_is_ok(torch_site: FakeSite) -> None:
    finding = the_finding(torch_site)
    assert finding.severity is Severity.OK
    assert "no bytecode cached yet for torch (5 of 5 sampled modules)" in finding.summary
    assert "the first import writes it" in finding.summary
    assert finding.remedy is None and "causes" not in finding.evidence


def test_unwritable_folder_fires(torch_site: FakeSite, clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setattr(bytecode, "can_write", lambda folder: False)
    finding = the_finding(torch_site)
    assert finding.severity is Severity.WARN
    (cause,) = finding.evidence["causes"]["torch"]
    assert cause.startswith("folders not writable by ")
    assert f"{torch_site.root / 'torch'} (owned by " in cause  # the folder __pycache__ would be made in
    assert cause.endswith(" and 1 more folders")  # torch/nn too
    assert " # as " in (finding.remedy or "") and "who can write" in (finding.remedy or "")
    assert "unset PYTHONDONTWRITEBYTECODE" not in (finding.remedy or "")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through any mode bits")
def test_read_only_folder_fires_for_real(torch_site: FakeSite) -> None:
    folders = [torch_site.root / "torch", torch_site.root / "torch" / "nn"]
    for folder in folders:
        folder.chmod(0o555)
    try:
        finding = the_finding(torch_site)
    finally:
        for folder in folders:
            folder.chmod(0o755)
    assert finding.severity is Severity.WARN
    assert finding.evidence["causes"]["torch"][0].startswith("folders not writable by ")


def test_cached_under_the_pycache_prefix_is_quiet(
    torch_site: FakeSite, clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    prefix = tmp_path / "pycache"
    compile_under_prefix(torch_site.root / "torch", prefix)
    clean_env.setenv("PYTHONPYCACHEPREFIX", str(prefix))
    clean_env.setenv(
        "PYTHONDONTWRITEBYTECODE", "1"
    )  # quiet because the prefix holds it, not because it'd be written
    finding = the_finding(torch_site)
    assert finding.severity is Severity.OK
    assert finding.summary == "bytecode cached for torch"
    assert str(prefix) in finding.evidence["pycache_prefix"]


def test_prefix_hides_the_bytecode_beside_the_sources(
    torch_site: FakeSite, clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    compile_beside(torch_site.root / "torch")
    prefix = tmp_path / "pycache"
    clean_env.setenv("PYTHONPYCACHEPREFIX", str(prefix))
    clean_env.setenv("PYTHONDONTWRITEBYTECODE", "1")
    finding = the_finding(torch_site)
    assert finding.severity is Severity.WARN
    causes = finding.evidence["causes"]["torch"]
    assert any("PYTHONPYCACHEPREFIX hides the bytecode beside the sources: 5 of" in c for c in causes)
    remedy = finding.remedy or ""
    assert remedy.startswith(f"PYTHONPYCACHEPREFIX={prefix} /fake/bin/python -m compileall")
    assert "or `unset PYTHONPYCACHEPREFIX`" in remedy
    assert finding.evidence["looked_for"]["torch"].startswith(str(prefix) + os.sep)


def test_remedy_names_the_audited_interpreter_and_each_uncached_folder(
    torch_site: FakeSite, clean_env: pytest.MonkeyPatch
) -> None:
    torch_site.add_dist(
        "transformers", "4.57.0", {"transformers/__init__.py": b"", "transformers/utils.py": b""}
    )
    torch_site.add_dist("sympy", "1.14.0", {"sympy/__init__.py": b""})
    torch_site.add_dist(
        "pytorch-triton", "3.5.0", {"triton/__init__.py": b""}
    )  # triton's folder, another name
    compile_beside(torch_site.root / "sympy")
    compile_beside(torch_site.root / "triton")
    clean_env.setenv("PYTHONDONTWRITEBYTECODE", "1")
    finding = the_finding(torch_site)
    assert finding.severity is Severity.WARN
    torch_dir, transformers_dir = torch_site.root / "torch", torch_site.root / "transformers"
    assert (finding.remedy or "").startswith(
        f"/fake/bin/python -m compileall -q -j 0 {torch_dir} {transformers_dir}  # "
    )
    assert str(torch_site.root / "sympy") not in (finding.remedy or "")  # cached: nothing to do
    assert set(finding.evidence["causes"]) == {"torch", "transformers"}
    assert finding.evidence["packages"]["sympy"] == "all 1 sampled modules have cached bytecode"
    assert finding.evidence["folders"]["triton"] == str(torch_site.root / "triton")
    assert "transformers (2 of 2 sampled modules)" in finding.summary


def test_optimize_level_looks_for_opt_files(torch_site: FakeSite, clean_env: pytest.MonkeyPatch) -> None:
    compile_beside(torch_site.root / "torch")  # plain .pyc only, as pip writes them
    clean_env.setenv("PYTHONOPTIMIZE", "1")
    clean_env.setenv("PYTHONDONTWRITEBYTECODE", "1")
    finding = the_finding(torch_site)
    assert finding.severity is Severity.WARN
    assert " -m compileall -q -j 0 -o 1 " in (finding.remedy or "")
    assert finding.evidence["looked_for"]["torch"].endswith(f"__init__.{TAG}.opt-1.pyc")
    compile_beside(torch_site.root / "torch", suffix=".opt-1")
    assert the_finding(torch_site).severity is Severity.OK


def test_no_torch_skips(site: FakeSite) -> None:
    site.add_dist("numpy", "2.0.0", {"numpy/__init__.py": b""})
    finding = the_finding(site)
    assert finding.severity is Severity.SKIP
    assert "torch is not installed" in finding.summary


def test_bytecode_path_is_importlibs_for_this_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = str(tmp_path / "pkg" / "mod.py")
    settings = BytecodeSettings(cache_tag=sys.implementation.cache_tag)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    assert bytecode_path(source, settings) == importlib.util.cache_from_source(source)
    assert bytecode_path(source, replace(settings, optimization=2)) == importlib.util.cache_from_source(
        source, optimization=2
    )
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "prefix"))
    under_prefix = replace(settings, pycache_prefix=str(tmp_path / "prefix"))
    assert bytecode_path(source, under_prefix) == importlib.util.cache_from_source(source)


def test_settings_read_the_variables_as_cpython_does() -> None:
    interp = env_for().interpreter
    assert cache_tag_of(interp) == TAG
    assert cache_tag_of(replace(interp, cache_tag="cpython-313")) == "cpython-313"
    assert cache_tag_of(replace(interp, implementation="pypy")) is None
    assert [optimization_level(v) for v in (None, "", "0", "1", "2", "yes", "-1")] == [0, 0, 0, 1, 2, 1, 1]
    site_set = settings_for(replace(interp, site_disables_bytecode=True), {})
    assert site_set is not None and "sitecustomize" in (site_set.dont_write or "")
    relative = settings_for(interp, {"PYTHONPYCACHEPREFIX": "rel"})
    assert relative is not None and relative.pycache_prefix == os.path.abspath("rel")


def test_sample_skips_folders_that_are_not_packages_and_caps_subpackages(
    torch_site: FakeSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = BytecodeSettings(cache_tag=TAG)
    sample = sample_package("torch", str(torch_site.root / "torch"), settings, writable=lambda folder: True)
    assert sample.sampled == 5 and not sample.unwritable
    assert sample.missing[0] == str(torch_site.root / "torch" / "__init__.py")  # surely imported: shown first
    monkeypatch.setattr(bytecode, "MAX_SUBPACKAGES", 0)
    assert sample_package("torch", str(torch_site.root / "torch"), settings).sampled == 3


def test_sample_names_other_interpreters_bytecode(torch_site: FakeSite) -> None:
    compile_beside(torch_site.root / "torch", tag="cpython-310")
    finding = the_finding(torch_site)
    assert finding.evidence["other_tags"] == {"torch": ["cpython-310"]}


def test_probe_reports_cache_tag_and_site_customisation(tmp_path: Path) -> None:
    site_packages = make_venv(tmp_path / "venv")
    python = str(tmp_path / "venv" / "bin" / "python")
    plain = probe_interpreter(python)
    assert plain.cache_tag == sys.implementation.cache_tag
    assert plain.site_disables_bytecode is False
    (site_packages / "no_pyc.pth").write_text("import sys; sys.dont_write_bytecode = True\n")
    assert probe_interpreter(python).site_disables_bytecode is True
