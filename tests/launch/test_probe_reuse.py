"""A passed deep probe is reused by `train` while the environment is the same; drift, `--deep` or a failed
probe run it again (issue 17). `check --deep` never reads the kept probes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_doctor.cli import run
from dflash_doctor.context import CheckContext
from dflash_doctor.deep import run as deep_run
from dflash_doctor.deep.run import ProbeReport
from dflash_doctor.env.gpus import GpuDevice, GpuInventory
from dflash_doctor.launch.probe_record import ProbeRecords, probe_key
from dflash_doctor.launch.runs import RunStore
from dflash_doctor.lock.lockfile import build_lock
from tests.conftest import env_for
from tests.fakeenv import FakeSite
from tests.launch.test_train_gate import launches  # noqa: F401  (fixture)

PASSING = {
    "import": {"ok": True, "seconds": 0.1},
    "torch": {"version": "2.13.0+cpu", "file": "/site/torch/__init__.py"},
    "cuda": {"available": False, "reason": "torch is a CPU build"},
    "libraries": {"loaded": [], "versions": {}},
    "flex": {"status": "skipped", "reason": "--no-flex"},
    "python_version": "3.11.7",
    "seconds": 0.2,
}


def gpus(driver: str = "580.65", name: str = "NVIDIA H200") -> GpuInventory:
    device = GpuDevice(0, name, None, (9, 0), 141 * 2**30, 140 * 2**30, 2**30)
    return GpuInventory(driver_version=driver, cuda_driver_version=13000, devices=[device])


def lock_of(site: FakeSite, inventory: GpuInventory | None = None, libraries: dict | None = None, **kw):
    env = env_for(site)
    return build_lock(env, libraries, inventory or gpus(), {}, created=kw.get("created", "2026-12-01"))


def test_the_probe_key_follows_everything_the_probe_proves_and_nothing_else(site: FakeSite) -> None:
    site.add_torch(version="2.13.0+cu130", git="aaaa")
    libs = {
        "libcudnn.so.9": {"path": "/s/libcudnn.so.9", "location": "<site>/x", "sha256": "1", "owners": []}
    }
    base = probe_key(lock_of(site, libraries=libs), {"flex": True}, probe_digest="p")
    assert probe_key(lock_of(site, libraries=libs, created="2027-01-01"), {"flex": True}, "p") == base
    changed_library = {"libcudnn.so.9": {**libs["libcudnn.so.9"], "sha256": "2"}}
    for other in (
        probe_key(lock_of(site, libraries=changed_library), {"flex": True}, "p"),  # a library's bytes
        probe_key(lock_of(site, gpus(driver="590.10"), libs), {"flex": True}, "p"),  # the driver
        probe_key(lock_of(site, gpus(name="NVIDIA H100"), libs), {"flex": True}, "p"),  # the GPUs
        probe_key(lock_of(site, libraries=libs), {"flex": True}, "another probe"),  # the probe's source
        probe_key(lock_of(site, libraries=libs), {"flex": False}, "p"),  # what the probe was asked
    ):
        assert other != base
    site.add_dist("nvidia-nccl-cu13", "2.28.9")  # a package more
    assert probe_key(lock_of(site, libraries=libs), {"flex": True}, "p") != base


def test_the_torch_commit_is_in_the_key(tmp_path: Path) -> None:
    keys = []
    for commit in ("aaaa", "bbbb"):  # same version string, another build
        site = FakeSite(tmp_path / commit / "site-packages")
        site.add_torch(version="2.13.0+cu130", git=commit)
        keys.append(probe_key(lock_of(site), {"flex": True}, "p"))
    assert keys[0] != keys[1]


def test_a_kept_probe_reads_back_and_garbage_reads_as_none(tmp_path: Path) -> None:
    records = ProbeRecords(tmp_path)
    records.save("k", ProbeReport(raw=PASSING, seconds=0.2), when=1.0)
    found = records.find("k")
    assert found is not None and found.report.raw == PASSING and found.when == 1.0
    assert records.find("other") is None
    records.path("bad").write_text("{not json")
    assert records.find("bad") is None


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> list[ProbeReport]:
    """Stand in for the probe child (the checks judge its report as usual); each call is one probe."""
    ran: list[ProbeReport] = []
    report = ProbeReport(raw=dict(PASSING), seconds=0.2)

    def fake_probe(*args: object, **kwargs: object) -> ProbeReport:
        ran.append(report)
        return report

    monkeypatch.setattr(deep_run, "run_probe", fake_probe)
    return ran


def test_train_reuses_a_passed_probe_until_drift_or_deep(
    launches: list[list[str]],  # noqa: F811
    probes: list[ProbeReport],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["train", "--config", "tiny-cpu"]) == 0 and len(probes) == 1
    assert "kept for launches from this same environment" in capsys.readouterr().out

    assert run(["train", "--config", "tiny-cpu"]) == 0 and len(probes) == 1  # reused, not run
    out = capsys.readouterr().out
    assert "was reused" in out and "--deep probes anew" in out
    record = RunStore().all()[-1]
    deep = [f for f in record.findings if f["id"].startswith("deep.")]
    assert deep and all("(from " in f["summary"] and "probed" in f["evidence"] for f in deep)
    assert any("was reused" in note for note in record.notes)

    assert run(["train", "--config", "tiny-cpu", "--deep"]) == 0 and len(probes) == 2  # forced
    monkeypatch.setenv("NCCL_DEBUG", "INFO")  # drift: a variable the lock records
    assert run(["train", "--config", "tiny-cpu"]) == 0 and len(probes) == 3
    assert run(["train", "--config", "tiny-cpu"]) == 0 and len(probes) == 3  # kept again for this one
    assert run(["train", "--config", "tiny-cpu", "--no-deep"]) == 0 and len(probes) == 3
    assert not [f for f in RunStore().all()[-1].findings if f["id"].startswith("deep.")]


def test_a_failed_probe_is_not_kept(
    launches: list[list[str]],  # noqa: F811
    probes: list[ProbeReport],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    broken = ProbeReport(error="the probe crashed (killed by signal 11) before printing its report")
    monkeypatch.setattr(deep_run, "run_probe", lambda *a, **k: probes.append(broken) or broken)
    assert run(["train", "--config", "tiny-cpu"]) == 1 and launches == []  # refused
    assert "not kept" in capsys.readouterr().out
    assert run(["train", "--config", "tiny-cpu"]) == 1 and len(probes) == 2  # probed again


def test_check_deep_always_probes(
    probes: list[ProbeReport], monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    for _ in range(2):
        run(["check", "--deep", "--only", "deep", "--no-lock"])
    assert len(probes) == 2


def test_the_gate_and_the_run_record_share_one_lock_per_run(site: FakeSite) -> None:
    """The probe key and the run record's environment come from one capture (ctx.shared), not two."""
    from dflash_doctor.lock.lockfile import current_lock

    ctx = CheckContext(env_for(site))
    assert current_lock(ctx) is current_lock(ctx)
