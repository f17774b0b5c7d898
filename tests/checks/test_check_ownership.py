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
        "/fake/bin/python -m pip uninstall -y nvidia-nccl-cu12 && "
        "/fake/bin/python -m pip install --force-reinstall --no-deps nvidia-nccl-cu13==2.30.7"
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


def test_identical_shared_data_file_is_information_only(site: FakeSite) -> None:
    site.add_torch()
    site.add_dist("pkg-a", "1.0", {"shared_ns/__init__.py": b"# namespace\n"})
    site.add_dist("pkg-b", "1.0", {"shared_ns/__init__.py": b"# namespace\n"})
    twins = by_id(run(site, "ownership.twins"))["ownership.twins.identical"]
    assert twins.severity is Severity.OK and twins.remedy is None


def test_identical_shared_library_warns_and_uninstalls_only_what_nothing_requires(site: FakeSite) -> None:
    site.add_torch(requires=["pkg-a"])
    site.add_dist("pkg-a", "1.0", {"shared/lib/libshared.so.1": b"same bytes"})
    site.add_dist("pkg-b", "1.0", {"shared/lib/libshared.so.1": b"same bytes"})
    twins = by_id(run(site, "ownership.twins"))["ownership.twins.identical"]
    assert twins.severity is Severity.WARN
    assert twins.evidence["keep"] == "pkg-a"
    assert twins.remedy == (
        "/fake/bin/python -m pip uninstall -y pkg-b && "
        "/fake/bin/python -m pip install --force-reinstall --no-deps pkg-a==1.0"
    )


def test_identical_shared_library_both_required_carries_no_uninstall(site: FakeSite) -> None:
    site.add_torch(requires=["pkg-a", "pkg-c"])
    site.add_dist("pkg-a", "1.0", {"shared/lib/libshared.so.1": b"same bytes"})
    site.add_dist("pkg-b", "1.0", {"shared/lib/libshared.so.1": b"same bytes"})
    site.add_dist("pkg-c", "1.0", requires=["pkg-b"])
    twins = by_id(run(site, "ownership.twins"))["ownership.twins.identical"]
    assert twins.remedy is None
    assert twins.evidence["not_uninstalled_because_required_by"] == {"pkg-b": ["pkg-c"]}


CU12_NAMESPACE_OWNERS = [
    "nvidia-cublas-cu12",
    "nvidia-cuda-runtime-cu12",
    "nvidia-cudnn-cu12",
    "nvidia-nccl-cu12",
]


def cu12_site(site: FakeSite) -> FakeSite:
    """A healthy cu128 torch: each nvidia-*-cu12 wheel ships the same empty `nvidia/__init__.py`."""
    site.add_torch(version="2.9.1+cu128", cuda="12.8", requires=[f"{n}==1.0" for n in CU12_NAMESPACE_OWNERS])
    for name in CU12_NAMESPACE_OWNERS:
        folder = name.removeprefix("nvidia-").removesuffix("-cu12").replace("-", "_")
        site.add_dist(
            name, "1.0", {"nvidia/__init__.py": b"", f"nvidia/{folder}/lib/lib{folder}.so.12": b"x"}
        )
    return site


def test_healthy_cu12_tree_sharing_an_empty_namespace_init_is_quiet(site: FakeSite) -> None:
    """Issue 19 A: the remedy for this 'twin' uninstalled 10 of torch's CUDA packages."""
    got = run(cu12_site(site), "ownership")
    assert [f.id for f in got if f.severity is not Severity.OK] == []
    assert all(f.remedy is None for f in got)
    assert "ownership.twins.identical" not in by_id(got)


def test_namespace_init_gone_is_not_a_failure(site: FakeSite) -> None:
    """Issue 19 B: pip deleted `nvidia/__init__.py` when one owner was replaced by a version without it."""
    cu12_site(site)
    (site.root / "nvidia/__init__.py").unlink()
    got = by_id(run(site, "ownership"))
    assert {f.severity for f in got.values()} == {Severity.OK}
    assert got["ownership.missing_files"].evidence["empty_init_files_gone"] == ["nvidia/__init__.py"]
    assert "ownership.twins" in got and got["ownership.twins"].remedy is None


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
    assert (
        missing.remedy
        == "/fake/bin/python -m pip install --force-reinstall --no-deps nvidia-nccl-cu13==2.30.7"
    )
    assert got["ownership.twins"].severity is Severity.OK


def test_changed_size_is_clobbered(site: FakeSite) -> None:
    cu13_site(site)
    (site.root / "nvidia/cudnn/lib/libcudnn.so.9").write_bytes(b"an older cudnn, longer")
    found = by_id(run(site, "ownership.clobbered"))["ownership.clobbered"]
    assert found.severity is Severity.FAIL
    assert "size" in found.evidence["files"]["nvidia/cudnn/lib/libcudnn.so.9"]
    assert (
        found.remedy
        == "/fake/bin/python -m pip install --force-reinstall --no-deps nvidia-cudnn-cu13==9.24.0.43"
    )


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
    assert twins.remedy.endswith("pip install --force-reinstall --no-deps nvidia-cudnn-cu12==9.10.2.21")
    assert "pip uninstall -y nvidia-cudnn-cu13 &&" in twins.remedy

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
        == "uv pip install --python /fake/bin/python --force-reinstall --no-deps nvidia-nccl-cu13==2.30.7"
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
    os.utime(lib, ns=(0, 0))  # a copy that kept an old mtime (`cp -a`, an image layer): not hashed
    audit_module.audit_records(dists, HashCache(), [str(lib)])
    assert hashed == []
    time.sleep(0.02)  # past the filesystem's timestamp tick
    lib.write_bytes(b"m" * 64)  # rewritten after install: same size, new mtime -> hashed
    audit_module.audit_records(dists, HashCache(), [str(lib)])
    assert hashed == [str(lib)]
    os.utime(lib, ns=(0, 0))  # `cp -p`-style old mtime: a ctime past the copy window still tells
    monkeypatch.setattr(audit_module, "COPY_WINDOW_NS", 0)
    audit_module.audit_records(dists, HashCache(), [str(lib)])
    assert hashed == [str(lib), str(lib)]


def test_patched_file_of_a_package_torch_does_not_load_is_information(site: FakeSite) -> None:
    """Seen on a real H200 image: a CA appended to certifi's cacert.pem; a file of a package torch
    does not need gone. Shown under -v, with the reinstall in the evidence, no warning."""
    cu13_site(site)
    site.add_dist("certifi", "2026.7.22", {"certifi/cacert.pem": b"-----BEGIN CERTIFICATE-----\n"})
    site.add_dist("pyelftools", "0.33", {"../../../bin/readelf.py": b"#!python\n"}, write_files=False)
    (site.root / "certifi/cacert.pem").write_bytes(b"-----BEGIN CERTIFICATE-----\n+ corporate CA\n")
    got = run(site, "ownership")
    clobbered = [f for f in got if f.id == "ownership.clobbered" and "certifi" in f.summary]
    missing = [f for f in got if f.id == "ownership.missing_files" and "pyelftools" in f.summary]
    assert clobbered and clobbered[0].severity is Severity.OK and clobbered[0].remedy is None
    assert clobbered[0].evidence["reinstall"].endswith("--force-reinstall --no-deps certifi==2026.7.22")
    assert missing and missing[0].severity is Severity.OK


def test_distribution_managed_package_gets_no_pip_remedy(site: FakeSite, tmp_path) -> None:
    """Issue 19 H: Debian-patched packages in a system Python are not pip's to fix."""
    from tests.fakeenv import FakeSite as Site

    cu13_site(site)
    site.add_dist("pyyaml", "6.0.1", {"yaml/__init__.py": b"# debian patched\n"}, installer="debian")
    (site.root / "yaml/__init__.py").write_bytes(b"# debian patched, and then again\n")
    dist_packages = Site(tmp_path / "usr" / "lib" / "python3" / "dist-packages")
    dist_packages.add_dist("cryptography", "41.0.7", {"cryptography/__init__.py": b"x = 1\n"})
    (next(dist_packages.root.glob("cryptography-*.dist-info")) / "INSTALLER").unlink()
    (dist_packages.root / "cryptography/__init__.py").write_bytes(b"x = 22\n")
    found = [f for f in run(site, "ownership.clobbered") if "pyyaml" in f.summary.lower()]
    assert found and found[0].severity is Severity.OK and found[0].remedy is None
    assert found[0].evidence["managed_by"] == "debian"
    from dflash_doctor.env.distributions import read_dist_info

    crypto = read_dist_info(str(next(dist_packages.root.glob("cryptography-*.dist-info"))))
    assert crypto is not None and crypto.managed_by == "dist-packages"


def test_code_gone_from_a_package_torch_does_not_load_warns(site: FakeSite) -> None:
    """Its own import fails: worth acting on, though torch is fine."""
    cu13_site(site)
    site.add_dist(
        "flash-attn-like",
        "2.8.0",
        {"flash_attn_like/__init__.py": b"import x\n", "flash_attn_like/_C.so": b"elf"},
    )
    (site.root / "flash_attn_like/_C.so").unlink()
    found = [f for f in run(site, "ownership.missing_files") if "flash-attn-like" in f.summary]
    assert (
        found and found[0].severity is Severity.WARN and "importing flash-attn-like fails" in found[0].summary
    )
    assert (
        found[0].remedy
        == "/fake/bin/python -m pip install --force-reinstall --no-deps flash-attn-like==2.8.0"
    )


def test_torch_file_clobbered_still_fails(site: FakeSite) -> None:
    cu13_site(site)
    (site.root / "filelock/__init__.py").write_bytes(b"longer than it was")
    found = by_id(run(site, "ownership.clobbered"))["ownership.clobbered"]
    assert found.severity is Severity.FAIL  # filelock is in torch's requirement closure
    assert found.remedy == "/fake/bin/python -m pip install --force-reinstall --no-deps filelock==3.20.0"


def test_twin_whose_stray_another_package_requires_is_not_uninstalled(site: FakeSite) -> None:
    cu13_site(site)
    site.add_dist("nvidia-nccl-cu12", "2.27.5", nccl_files("cu12"))
    site.add_dist("some-serving-stack", "1.0", requires=["nvidia-nccl-cu12"])
    twins = by_id(run(site, "ownership.twins"))["ownership.twins"]
    assert twins.evidence["not_uninstalled_because_required_by"] == {
        "nvidia-nccl-cu12": ["some-serving-stack"]
    }
    assert (
        twins.remedy == "/fake/bin/python -m pip install --force-reinstall --no-deps nvidia-nccl-cu13==2.30.7"
    )


def test_the_audit_answers_the_same_surveyed_in_forked_processes(site: FakeSite, monkeypatch) -> None:
    """Twins, a RECORD listing one path twice, a file gone, one resized, a library rewritten: the same audit
    whether one process stats every file, four do, or four children started before the audit do (the slices'
    indexes map back to the right rows). The watched file has no `.so` name: the survey does not watch it,
    and the audit stats it itself."""
    import dataclasses

    from dflash_doctor.env import forked, size_survey
    from dflash_doctor.env import record_audit as audit_module
    from dflash_doctor.env.file_hashes import HashCache
    from tests.conftest import env_for

    for index in range(6):
        site.add_dist(f"pkg{index}", "1.0", {f"pkg{index}/m{n}.py": b"p" * (n + index) for n in range(9)})
    site.add_dist("nvidia-nccl-cu12", "2.21.5", {"nvidia/nccl/lib/libnccl.so.2": b"a" * 40})
    site.add_dist("nvidia-nccl-cu13", "2.28.9", {"nvidia/nccl/lib/libnccl.so.2": b"b" * 40})
    record = next(site.root.glob("pkg2-*.dist-info")) / "RECORD"
    record.write_text(record.read_text() + record.read_text().splitlines()[0] + "\n")  # one row listed twice
    (site.root / "pkg1/m3.py").unlink()
    (site.root / "pkg4/m5.py").write_bytes(b"longer than its RECORD says")
    dists = env_for(site).distributions
    lib = site.root / "pkg5/m7.py"
    monkeypatch.setattr(audit_module, "_changed_since_install", lambda *args: True)

    def audit(processes: int, beside: bool = False) -> dict[str, object]:
        """`beside`: the stat started before the audit, every slice in a child (as `check` runs it)."""
        monkeypatch.setattr(size_survey, "MAX_PROCESSES", processes)
        started = audit_module.start_record_survey(dists) if beside else None
        found = audit_module.audit_records(dists, HashCache(), [str(lib)], started=started)
        assert found.files_hashed + found.cache_hits >= 1  # the watched file, by its sha256
        assert found.processes == processes
        keep = ("shared", "missing", "changed", "files_checked")
        return {k: v for k, v in dataclasses.asdict(found).items() if k in keep}

    monkeypatch.setattr(size_survey, "PATHS_PER_PROCESS", 5)
    monkeypatch.setattr(forked, "usable_cpus", lambda: 4)
    monkeypatch.setattr(forked, "thread_count", lambda: 1)
    one = audit(1)
    lib.write_bytes(b"q" * len(lib.read_bytes()))  # same size, other bytes: found by its sha256 alone
    one_after, four_after, four_beside = audit(1), audit(4), audit(4, beside=True)
    assert one_after == four_after == four_beside != one
    assert set(four_after["missing"]) == {"pkg1"}  # type: ignore[arg-type]
    assert set(four_after["changed"]) == {"pkg4", "pkg5"}  # type: ignore[arg-type]
    shared = {s["path"].split("/site/")[-1]: s["owners"] for s in four_after["shared"]}  # type: ignore[attr-defined]
    assert len(shared) == 2 and ("pkg2", "pkg2") in shared.values()
    assert ("nvidia-nccl-cu12", "nvidia-nccl-cu13") in shared.values()
