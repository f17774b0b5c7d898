"""ownership.* findings: twins, clobbered files, files gone; each fires and each stays quiet."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_doctor.findings import Severity
from tests.fakeenv import FakeSite
from tests.packaging_fixtures import by_id, cu13_site, nccl_files, run


@pytest.fixture(autouse=True)
def hermetic_hash_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_DOCTOR_CACHE_DIR", str(tmp_path / "hash-cache"))


def test_healthy_tree_is_quiet(site: FakeSite) -> None:
    got = by_id(run(cu13_site(site), "ownership"))
    assert set(got) == {"ownership.twins", "ownership.clobbered", "ownership.missing_files"}
    assert all(f.severity is Severity.OK for f in got.values())
    assert got["ownership.clobbered"].evidence["files_checked"] > 10


def test_nccl_twin_installed_over_torchs_nccl_fails_with_exact_remedy(site: FakeSite) -> None:
    cu13_site(site)
    site.add_dist("nvidia-nccl-cu12", "2.27.5", nccl_files("cu12"))  # pip overwrites the cu13 files
    twins = by_id(run(site, "ownership"))["ownership.twins"]
    assert twins.severity is Severity.FAIL
    assert twins.evidence["owners"] == {"nvidia-nccl-cu12": "2.27.5", "nvidia-nccl-cu13": "2.30.7"}
    assert twins.evidence["bytes_on_disk_match"]["nvidia/nccl/lib/libnccl.so.2"] == "nvidia-nccl-cu12"
    assert next(iter(twins.evidence["bytes_on_disk_match"])).endswith("libnccl.so.2")  # libraries first
    assert twins.evidence["keep"] == "nvidia-nccl-cu13"
    assert twins.remedy == (
        "/fake/bin/python -m pip uninstall nvidia-nccl-cu12 && "
        "/fake/bin/python -m pip install --force-reinstall nvidia-nccl-cu13==2.30.7"
    )
    # the twin's files are not double-reported as clobbered
    assert by_id(run(site, "ownership.clobbered"))["ownership.clobbered"].severity is Severity.OK


def test_twin_whose_bytes_still_belong_to_the_wanted_owner_still_fails(site: FakeSite) -> None:
    site.add_torch(version="2.14.1+cu130", cuda="13.0", requires=["nvidia-nccl-cu13==2.30.7"])
    site.add_dist("nvidia-nccl-cu12", "2.27.5", nccl_files("cu12"))
    site.add_dist("nvidia-nccl-cu13", "2.30.7", nccl_files("cu13"))  # installed last: its bytes win
    twins = by_id(run(site, "ownership.twins"))["ownership.twins"]
    assert twins.severity is Severity.FAIL
    assert "for now" in twins.summary
    assert twins.evidence["bytes_on_disk_match"]["nvidia/nccl/lib/libnccl.so.2"] == "nvidia-nccl-cu13"


def test_identical_shared_files_only_warn(site: FakeSite) -> None:
    site.add_torch()
    site.add_dist("pkg-a", "1.0", {"shared_ns/__init__.py": b"# namespace\n"})
    site.add_dist("pkg-b", "1.0", {"shared_ns/__init__.py": b"# namespace\n"})
    twins = by_id(run(site, "ownership.twins"))["ownership.twins.identical"]
    assert twins.severity is Severity.WARN


def test_uninstalling_the_twin_leaves_the_survivor_missing_its_files(site: FakeSite) -> None:
    cu13_site(site)
    site.add_dist("nvidia-nccl-cu12", "2.27.5", nccl_files("cu12"))
    site.remove_dist("nvidia-nccl-cu12")  # deletes nvidia/nccl/lib/libnccl.so.2, which cu13 still lists
    got = by_id(run(site, "ownership"))
    missing = got["ownership.missing_files"]
    assert missing.severity is Severity.FAIL
    assert "nvidia-nccl-cu13 2.30.7 (torch needs it)" in missing.summary
    assert missing.evidence["files"][0] == "nvidia/nccl/lib/libnccl.so.2"
    assert missing.evidence["count"] == 2
    assert missing.remedy == "/fake/bin/python -m pip install --force-reinstall nvidia-nccl-cu13==2.30.7"
    assert got["ownership.twins"].severity is Severity.OK


def test_changed_size_is_clobbered(site: FakeSite) -> None:
    cu13_site(site)
    (site.root / "nvidia/cudnn/lib/libcudnn.so.9").write_bytes(b"an older cudnn, longer")
    found = by_id(run(site, "ownership.clobbered"))["ownership.clobbered"]
    assert found.severity is Severity.FAIL
    assert "size" in found.evidence["files"]["nvidia/cudnn/lib/libcudnn.so.9"]
    assert found.remedy == "/fake/bin/python -m pip install --force-reinstall nvidia-cudnn-cu13==9.24.0.43"


def test_same_size_other_bytes_in_a_preloaded_library_is_clobbered(site: FakeSite) -> None:
    cu13_site(site)
    (site.root / "nvidia/cudnn/lib/libcudnn.so.9").write_bytes(b"CUDNN9")  # same length, other bytes
    found = by_id(run(site, "ownership.clobbered"))["ownership.clobbered"]
    assert found.severity is Severity.FAIL
    assert "sha256" in found.evidence["files"]["nvidia/cudnn/lib/libcudnn.so.9"]


def test_same_size_edit_of_a_plain_file_is_not_hashed(site: FakeSite) -> None:
    # Only libraries and shared files get a sha256 (cost); sizes are checked for everything.
    cu13_site(site)
    (site.root / "filelock/__init__.py").write_bytes(b"")
    assert by_id(run(site, "ownership.clobbered"))["ownership.clobbered"].severity is Severity.OK


def test_bytecode_and_hashless_rows_are_ignored(site: FakeSite) -> None:
    site.add_torch()
    site.add_dist(
        "pkg", "1.0", {"pkg/__init__.py": b"x = 1\n", "pkg/__pycache__/__init__.cpython-311.pyc": b"pyc"}
    )
    (site.root / "pkg/__pycache__/__init__.cpython-311.pyc").unlink()
    got = by_id(run(site, "ownership"))
    assert got["ownership.missing_files"].severity is Severity.OK


def test_cu128_torch_story_cudnn_cu13_over_cu12_then_its_removal(site: FakeSite) -> None:
    """The story the other way round: a cu128 torch, a CUDA 13 cuDNN installed over its cuDNN, then removed."""
    site.add_torch(version="2.10.0+cu128", cuda="12.8", requires=["nvidia-cudnn-cu12==9.10.2.21"])
    cudnn = "nvidia/cudnn/lib/libcudnn.so.9"
    site.add_dist("nvidia-cudnn-cu12", "9.10.2.21", {cudnn: b"cudnn 9.10 for CUDA 12"})
    site.add_dist("nvidia-cudnn-cu13", "9.24.0.43", {cudnn: b"cudnn 9.24 for CUDA 13"})
    twins = by_id(run(site, "ownership.twins"))["ownership.twins"]
    assert twins.evidence["keep"] == "nvidia-cudnn-cu12"
    assert twins.remedy is not None
    assert twins.remedy.endswith("pip install --force-reinstall nvidia-cudnn-cu12==9.10.2.21")
    assert "pip uninstall nvidia-cudnn-cu13 &&" in twins.remedy

    site.remove_dist("nvidia-cudnn-cu13")  # "cleaning up the CUDA 13 contaminants"
    missing = by_id(run(site, "ownership.missing_files"))["ownership.missing_files"]
    assert missing.evidence["files"] == [cudnn]
    assert missing.remedy is not None and missing.remedy.endswith("nvidia-cudnn-cu12==9.10.2.21")


def test_remedy_uses_uv_for_a_pip_less_uv_environment(site: FakeSite) -> None:
    site.add_torch(version="2.14.1+cu130", cuda="13.0", requires=["nvidia-nccl-cu13==2.30.7"])
    (next(site.root.glob("torch-*.dist-info")) / "INSTALLER").write_text("uv\n")
    site.add_dist("nvidia-nccl-cu13", "2.30.7", nccl_files("cu13"), installer="uv")
    (site.root / "nvidia/nccl/lib/libnccl.so.2").unlink()
    missing = by_id(run(site, "ownership.missing_files"))["ownership.missing_files"]
    assert (
        missing.remedy
        == "uv pip install --python /fake/bin/python --force-reinstall nvidia-nccl-cu13==2.30.7"
    )


def test_library_untouched_since_install_is_not_rehashed(site: FakeSite, monkeypatch) -> None:
    """ctime no newer than the owner's RECORD: the installed bytes, no 500 MB hash needed."""
    import os
    import time

    from dflash_doctor.env import record_audit as audit_module
    from dflash_doctor.env.file_hashes import HashCache
    from tests.conftest import env_for

    site.add_dist("nvidia-nccl-cu13", "2.30.7", {"nvidia/nccl/lib/libnccl.so.2": b"n" * 64})
    record = next(site.root.glob("nvidia_nccl_cu13-*.dist-info")) / "RECORD"
    later = os.stat(record).st_ctime_ns
    lib = site.root / "nvidia/nccl/lib/libnccl.so.2"
    hashed: list[str] = []
    monkeypatch.setattr(HashCache, "digest", lambda self, path: hashed.append(path) or None)
    dists = env_for(site).distributions
    audit_module.audit_records(dists, HashCache(), [str(lib)])
    assert os.stat(lib).st_ctime_ns <= later and hashed == []
    time.sleep(0.02)  # past the filesystem's timestamp tick
    lib.write_bytes(b"m" * 64)  # rewritten after install: same size, new ctime -> hashed
    os.utime(lib, ns=(0, 0))  # `cp -p`-style old mtime: ctime still tells
    audit_module.audit_records(dists, HashCache(), [str(lib)])
    assert hashed == [str(lib)]


def test_patched_data_file_of_an_unrelated_package_only_warns(site: FakeSite) -> None:
    """Seen on a real H200 image: a CA appended to certifi's cacert.pem; a script `--target` left elsewhere."""
    cu13_site(site)
    site.add_dist("certifi", "2026.7.22", {"certifi/cacert.pem": b"-----BEGIN CERTIFICATE-----\n"})
    site.add_dist("pyelftools", "0.33", {"../../../bin/readelf.py": b"#!python\n"}, write_files=False)
    (site.root / "certifi/cacert.pem").write_bytes(b"-----BEGIN CERTIFICATE-----\n+ corporate CA\n")
    got = run(site, "ownership")
    clobbered = [f for f in got if f.id == "ownership.clobbered" and "certifi" in f.summary]
    missing = [f for f in got if f.id == "ownership.missing_files" and "pyelftools" in f.summary]
    assert clobbered and clobbered[0].severity is Severity.WARN
    assert missing and missing[0].severity is Severity.WARN
