"""lock + drift: the lock records what tells builds apart; diff names exactly what changed, nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_base.errors import DoctorError
from dflash_doctor.cli import run
from dflash_doctor.context import CheckContext, CheckOptions
from dflash_doctor.env.gpus import GpuDevice, GpuInventory, launch_view
from dflash_doctor.findings import Severity
from dflash_doctor.lock.drift import diff_locks
from dflash_doctor.lock.lockfile import (
    REDACTED,
    EnvironmentLock,
    build_lock,
    capture_lock,
    read_lock,
    relevant_environment,
    write_lock,
)
from dflash_doctor.registry import run_checks
from tests.conftest import env_for
from tests.fakeenv import FakeSite, build_elf, make_venv
from tests.libs_fixtures import TORCH_RPATH, cuda_libs, install_cuda_torch

__all__ = ["cuda_libs"]

OLD_GIT = "cf30153c4c131c8164ee7798e5022d810682e2cb"
NEW_GIT = "5c4886908584029761b579af026dcfb627c84070"


@pytest.fixture(autouse=True)
def hermetic_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file-hash cache and anything else the tool keeps goes under the test's folder."""
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DFLASH_DOCTOR_CACHE_DIR", raising=False)


def lock_of(site: FakeSite, libraries: dict | None = None, gpus: GpuInventory | None = None, environ=None):
    return build_lock(env_for(site), libraries, gpus, environ or {}, created="2026-11-30T00:00:00+00:00")


def kinds(changes) -> dict[tuple[str, str], Severity]:
    return {(c.kind, c.subject): c.severity for c in changes}


# --- the pure parts ------------------------------------------------------------------------------


def test_environment_is_filtered_and_secrets_redacted() -> None:
    env = relevant_environment(
        {
            "HOME": "/root",
            "TORCHINDUCTOR_CACHE_DIR": "/data/cache",
            "TORCHINDUCTOR_REDIS_URL": "redis://bob:hunter2@cache.internal:6379/0",
            "TRITON_API_TOKEN": "abc",
            "NCCL_IB_PASSWORD": "x",
            "CUDA_VISIBLE_DEVICES": "0,1",
            "LD_LIBRARY_PATH": "/opt/cuda/lib64",
            "TORCH_COMPILE_CACHE_KEY_TAG": "v2",
        }
    )
    assert "HOME" not in env
    assert env["TORCHINDUCTOR_REDIS_URL"] == f"redis://{REDACTED}@cache.internal:6379/0"
    assert env["TRITON_API_TOKEN"] == REDACTED and env["NCCL_IB_PASSWORD"] == REDACTED
    assert env["TORCH_COMPILE_CACHE_KEY_TAG"] == "v2"  # a cache salt, not a secret
    assert list(env) == sorted(env)


def test_lock_records_what_tells_builds_apart(site: FakeSite) -> None:
    site.add_torch(version="2.10.0+cu128", cuda="12.8", build="3")
    site.add_dist("triton", "3.5.0")
    gpus = GpuInventory("580.159.04", 13000, [GpuDevice(0, "NVIDIA H200", None, (9, 0), 10, 9, 1)])
    lock = lock_of(site, gpus=gpus)
    assert lock.torch == {
        "version": "2.10.0+cu128",
        "local_tag": "cu128",
        "git_version": OLD_GIT,
        "cuda": "12.8",
        "hip": None,
    }
    row = lock.distributions["torch"]
    assert row["wheel_build"] == "3" and row["installer"] == "pip" and len(row["record_sha256"]) == 64
    assert lock.triton == {"version": "3.5.0"}
    assert lock.driver == {"version": "580.159.04", "cuda": "13.0"}
    assert lock.gpus[0]["name"] == "NVIDIA H200" and lock.gpus[0]["capability"] == [9, 0]


def test_lock_records_the_hosts_gpus_whatever_cuda_visible_devices_shows(site: FakeSite) -> None:
    """The lock describes the machine; which GPUs a shell showed is in its `environment`."""
    site.add_torch()
    host = GpuInventory(
        "580.159.04", 13000, [GpuDevice(i, "NVIDIA H200", None, (9, 0), 10, 9, 1) for i in range(4)]
    )
    narrowed = launch_view(host, "2")
    assert [d.index for d in narrowed.devices] == [2]
    lock = lock_of(site, gpus=narrowed, environ={"CUDA_VISIBLE_DEVICES": "2"})
    assert [g["index"] for g in lock.gpus] == [0, 1, 2, 3] and lock.environment["CUDA_VISIBLE_DEVICES"] == "2"
    assert lock.gpus == lock_of(site, gpus=host).gpus


def test_diff_of_a_lock_with_itself_is_empty(site: FakeSite) -> None:
    site.add_torch()
    libs = {"libnccl.so.2": {"path": "/x/libnccl.so.2", "sha256": "a" * 64, "owners": ["nvidia-nccl-cu13"]}}
    lock = lock_of(site, libs, environ={"NCCL_DEBUG": "INFO"})
    again = EnvironmentLock.from_json(json.loads(json.dumps(lock.to_json())))
    assert diff_locks(lock, again) == []


def test_same_version_other_commit_and_build_fail(tmp_path: Path) -> None:
    a, b = FakeSite(tmp_path / "a"), FakeSite(tmp_path / "b")
    a.add_torch(version="2.10.0", git=OLD_GIT)
    b.add_torch(version="2.10.0", git=NEW_GIT, build="3")
    changes = diff_locks(lock_of(a), lock_of(b))
    got = kinds(changes)
    assert got[("torch.commit", "torch")] is Severity.FAIL
    assert got[("package.build", "torch")] is Severity.FAIL
    commit = next(c for c in changes if c.kind == "torch.commit")
    assert OLD_GIT[:12] in commit.summary or OLD_GIT in commit.summary
    assert commit.before == OLD_GIT and commit.after == NEW_GIT


def test_version_changes_warn_and_added_removed(tmp_path: Path) -> None:
    a, b = FakeSite(tmp_path / "a"), FakeSite(tmp_path / "b")
    a.add_torch(version="2.13.0+cpu")
    a.add_dist("numpy", "2.0.0")
    a.add_dist("nvidia-nccl-cu12", "2.27.3")
    b.add_torch(version="2.13.0+cpu")
    b.add_dist("numpy", "2.1.0")
    b.add_dist("nvidia-nccl-cu13", "2.30.7")
    got = kinds(diff_locks(lock_of(a), lock_of(b)))
    assert got == {
        ("package.version", "numpy"): Severity.WARN,
        ("package.removed", "nvidia-nccl-cu12"): Severity.WARN,
        ("package.added", "nvidia-nccl-cu13"): Severity.WARN,
    }


def test_library_bytes_owner_and_environment_changes(site: FakeSite) -> None:
    site.add_torch()
    before = {
        "libnccl.so.2": {
            "path": "/v/nvidia/nccl/lib/libnccl.so.2",
            "sha256": "a" * 64,
            "owners": ["nvidia-nccl-cu12"],
        },
        "libc.so.6": {"path": "/usr/lib/libc.so.6", "sha256": "c" * 64, "owners": []},
    }
    after = {
        "libnccl.so.2": {
            "path": "/v/nvidia/nccl/lib/libnccl.so.2",
            "sha256": "b" * 64,
            "owners": ["nvidia-nccl-cu13"],
        },
        "libc.so.6": {"path": "/usr/lib/libc.so.6", "sha256": "d" * 64, "owners": []},
    }
    got = kinds(
        diff_locks(lock_of(site, before, environ={"NCCL_P2P_DISABLE": "1"}), lock_of(site, after, environ={}))
    )
    assert got == {
        ("library.hash", "libnccl.so.2"): Severity.FAIL,
        ("library.owner", "libnccl.so.2"): Severity.WARN,
        ("library.hash", "libc.so.6"): Severity.WARN,  # a system file: the OS updated it
        ("env.removed", "NCCL_P2P_DISABLE"): Severity.WARN,
    }


def test_unmodelled_libraries_are_not_a_change(site: FakeSite) -> None:
    site.add_torch()
    libs = {"libnccl.so.2": {"path": "/x", "sha256": "a" * 64, "owners": []}}
    assert diff_locks(lock_of(site, None), lock_of(site, libs)) == []


def test_runtime_context_growth_warns(site: FakeSite) -> None:
    site.add_torch()
    a, b = lock_of(site), lock_of(site)
    a.runtime = {"context_overhead_mib": {"0": 540.0}}
    b.runtime = {"context_overhead_mib": {"0": 746.8}}
    assert kinds(diff_locks(a, b)) == {("runtime.context_overhead", "cuda:0"): Severity.WARN}


def test_write_is_atomic_sorted_and_read_back(site: FakeSite, tmp_path: Path) -> None:
    site.add_torch()
    lock = lock_of(site)
    path = write_lock(lock, tmp_path / "dflash.lock")
    text = path.read_text()
    assert json.loads(text)["schema"] == "dflash-doctor/lock/v1"
    assert list(json.loads(text)) == sorted(json.loads(text))  # sorted keys: diffable
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".dflash.lock")] == []  # no temp left
    assert read_lock(path).to_json() == lock.to_json()


def test_bad_lock_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.lock"
    bad.write_text('{"schema": "something/else"}')
    with pytest.raises(DoctorError, match="not a dflash-doctor lock"):
        read_lock(bad)


# --- through the checks, with real ELF files and the static loader model ---------------------------


def _check(site: FakeSite, lock_path: Path) -> dict[str, list]:
    runs = run_checks(CheckContext(env_for(site), CheckOptions(lock_path=lock_path)), ["drift"])
    out: dict[str, list] = {}
    for f in (f for r in runs for f in r.findings):
        out.setdefault(f.id, []).append(f)
    return out


def test_check_lock_is_quiet_on_the_locked_environment(site: FakeSite, cuda_libs, tmp_path: Path) -> None:
    install_cuda_torch(site, cuda_libs)
    lock = capture_lock(CheckContext(env_for(site)))
    assert lock.libraries and lock.libraries["libnccl.so.2"]["owners"] == ["nvidia-nccl-cu13"]
    path = write_lock(lock, tmp_path / "dflash.lock")
    got = _check(site, path)
    assert list(got) == ["drift.lock"] and got["drift.lock"][0].severity is Severity.OK


def test_swapped_torch_build_fails_naming_old_and_new(site: FakeSite, cuda_libs, tmp_path: Path) -> None:
    install_cuda_torch(site, cuda_libs)
    path = write_lock(capture_lock(CheckContext(env_for(site))), tmp_path / "dflash.lock")
    other_cuda = build_elf(
        tmp_path / "other" / "libtorch_cuda.so",
        "libtorch_cuda.so",
        ["libcudart.so.13", "libcusparse.so.12", "libnccl.so.2", "libcudnn.so.9"],
        rpath=TORCH_RPATH,
        symbol="another_build",
    )
    # "the same" torch reinstalled: same version string, another commit, other bytes
    site.add_torch(
        version="2.14.1+cu130",
        cuda="13.0",
        git=NEW_GIT,
        extra_files={
            "torch/__init__.py": (site.root / "torch/__init__.py").read_bytes(),
            "torch/_C.cpython-311-x86_64-linux-gnu.so": cuda_libs["_C"],
            "torch/lib/libtorch_global_deps.so": cuda_libs["global_deps"],
            "torch/lib/libtorch_python.so": cuda_libs["python"],
            "torch/lib/libtorch_cuda.so": other_cuda,
            "torch/lib/libtorch_cuda_linalg.so": cuda_libs["linalg"],
        },
    )
    got = _check(site, path)
    commit = got["drift.torch.commit"][0]
    assert commit.severity is Severity.FAIL
    assert commit.evidence["locked"] != commit.evidence["now"] and commit.evidence["now"] == NEW_GIT
    lib = got["drift.library.hash"][0]
    assert lib.severity is Severity.FAIL and lib.evidence["subject"] == "libtorch_cuda.so"
    assert "--force-reinstall" in (lib.remedy or "") and "torch==2.14.1" in (lib.remedy or "")
    # nothing else: RECORD of torch changed too (other hashes), and that is all
    assert set(got) == {"drift.torch.commit", "drift.library.hash", "drift.package.record"}


def test_altered_library_bytes_fail_and_nothing_else(site: FakeSite, cuda_libs, tmp_path: Path) -> None:
    install_cuda_torch(site, cuda_libs)
    path = write_lock(capture_lock(CheckContext(env_for(site))), tmp_path / "dflash.lock")
    nccl = site.root / "nvidia/nccl/lib/libnccl.so.2"
    nccl.write_bytes(nccl.read_bytes() + b"\0patched")
    got = _check(site, path)
    assert set(got) == {"drift.library.hash"}
    finding = got["drift.library.hash"][0]
    assert finding.severity is Severity.FAIL and finding.evidence["subject"] == "libnccl.so.2"
    assert "nvidia-nccl-cu13==2.30.7" in (finding.remedy or "")


# --- the commands, through a real interpreter (--python) -----------------------------------------


def test_lock_then_diff_cli(tmp_path: Path, cuda_libs, capsys: pytest.CaptureFixture[str]) -> None:
    site = FakeSite(make_venv(tmp_path / "venv"))
    install_cuda_torch(site, cuda_libs)
    python = str(tmp_path / "venv" / "bin" / "python")
    lock_path = tmp_path / "dflash.lock"
    assert run(["lock", "--out", str(lock_path), "--python", python]) == 0
    assert "wrote" in capsys.readouterr().out
    assert run(["diff", str(lock_path), "--python", python, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["changes"] == []

    nccl = site.root / "nvidia/nccl/lib/libnccl.so.2"
    nccl.write_bytes(nccl.read_bytes() + b"\0patched")
    site.add_dist("numpy", "2.1.0")
    assert run(["diff", str(lock_path), "--python", python, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [(c["kind"], c["subject"], c["severity"]) for c in report["changes"]] == [
        ("library.hash", "libnccl.so.2", "fail"),
        ("package.added", "numpy", "warn"),
    ]
    assert run(["diff", str(lock_path), "--python", python]) == 1
    assert "libnccl.so.2" in capsys.readouterr().out
    assert run(["check", "--lock", str(lock_path), "--python", python, "--only", "drift"]) == 1


def test_diff_two_locks_and_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    a, b = FakeSite(tmp_path / "a"), FakeSite(tmp_path / "b")
    a.add_torch(version="2.10.0", git=OLD_GIT)
    b.add_torch(version="2.10.0", git=NEW_GIT)
    pa, pb = write_lock(lock_of(a), tmp_path / "a.lock"), write_lock(lock_of(b), tmp_path / "b.lock")
    assert run(["diff", str(pa), str(pb)]) == 1
    out = capsys.readouterr().out
    assert "torch.commit" in out and OLD_GIT in out and NEW_GIT in out
    monkeypatch.chdir(tmp_path)
    assert run(["diff"]) == 2  # no ./dflash.lock
    assert run(["diff", str(tmp_path / "missing.lock")]) == 2


def test_a_moved_venv_is_no_change(tmp_path: Path) -> None:
    """Same wheels in two venvs: RECORD rows for bin/ scripts differ (shebangs), locations do not."""
    a, b = FakeSite(tmp_path / "a" / "site-packages"), FakeSite(tmp_path / "b" / "site-packages")
    for site, shebang in ((a, b"#!/a/bin/python"), (b, b"#!/b/bin/python")):
        site.add_dist("pip", "24.0", {"pip/__init__.py": b"", "../../bin/pip": shebang})
        site.add_torch()
    row = {"sha256": "a" * 64, "owners": ["torch"]}
    libs_a = {
        "libc10.so": {**row, "path": "/a/torch/lib/libc10.so", "location": "<site>/torch/lib/libc10.so"}
    }
    libs_b = {
        "libc10.so": {**row, "path": "/b/torch/lib/libc10.so", "location": "<site>/torch/lib/libc10.so"}
    }
    assert diff_locks(lock_of(a, libs_a), lock_of(b, libs_b)) == []
    libs_b["libc10.so"]["location"] = "/opt/elsewhere/libc10.so"
    assert kinds(diff_locks(lock_of(a, libs_a), lock_of(b, libs_b))) == {
        ("library.path", "libc10.so"): Severity.WARN
    }
