"""gpu.*: NVML is faked at the binding boundary (the pynvml functions), nothing above it."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

import dflash_doctor.env.gpus as gpus
from dflash_doctor.context import CheckContext
from dflash_doctor.findings import Finding, Severity
from dflash_doctor.registry import run_checks
from tests.conftest import env_for
from tests.fakeenv import FakeSite

GIB = 1 << 30


class NVMLError(Exception):
    pass


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    cap: tuple[int, int] = (9, 0)
    total: int = 141 * GIB
    free: int = 140 * GIB
    pids: list[tuple[int, int | None]] = field(default_factory=list)


class FakeNvml:
    """The subset of pynvml that dflash_doctor.env.gpus calls, answering like a real driver would."""

    def __init__(
        self, gpus_: list[FakeGpu], driver: str = "580.159.04", cuda: int = 13000, broken: bool = False
    ):
        self.gpus, self.driver, self.cuda, self.broken = gpus_, driver, cuda, broken
        self.shutdown = False

    def nvmlInit(self) -> None:
        if self.broken:
            raise NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def nvmlDeviceGetName(self, h: FakeGpu) -> bytes:
        return h.name.encode()

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return "GPU-" + h.name.replace(" ", "-")

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeGpu) -> tuple[int, int]:
        return h.cap

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> SimpleNamespace:
        return SimpleNamespace(total=h.total, free=h.free, used=h.total - h.free)

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in h.pids]


def run_gpu(monkeypatch: pytest.MonkeyPatch, nvml: FakeNvml, site: FakeSite) -> dict[str, Finding]:
    monkeypatch.setattr(gpus, "_binding", lambda: nvml)
    runs = run_checks(CheckContext(env_for(site)), ["gpu"])
    return {f.id: f for r in runs for f in r.findings}


def test_read_gpus_reads_every_field_and_shuts_down() -> None:
    nvml = FakeNvml([FakeGpu(pids=[(4242, 2 * GIB), (7, 2**64 - 1)])])
    inv = gpus.read_gpus(nvml)
    assert inv.cuda_driver == "13.0" and inv.driver_major == 580
    dev = inv.devices[0]
    assert (dev.name, dev.sm, dev.free_bytes) == ("NVIDIA H200", "sm_90", 140 * GIB)
    assert [p.used_bytes for p in dev.processes] == [2 * GIB, None]  # NVML's "not available" sentinel
    assert nvml.shutdown


def test_no_driver_skips_every_gpu_check_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, site: FakeSite
) -> None:
    site.add_torch(version="2.11.0+cu130", cuda="13.0")
    got = run_gpu(monkeypatch, FakeNvml([], broken=True), site)
    assert {f.severity for f in got.values()} == {Severity.SKIP}
    assert set(got) == {"gpu.driver", "gpu.arch", "gpu.memory"}
    assert "Library Not Found" in got["gpu.driver"].summary


def test_real_machine_without_driver_skips(site: FakeSite) -> None:
    """This box has no NVIDIA driver: the real binding must give a reason, not crash."""
    site.add_torch()
    runs = run_checks(CheckContext(env_for(site)), ["gpu"])
    found = [f for r in runs for f in r.findings]
    if gpus.query_gpus() is None:
        assert {f.severity for f in found} == {Severity.SKIP}


def test_healthy_h200_is_quiet(monkeypatch: pytest.MonkeyPatch, site: FakeSite) -> None:
    site.add_torch(version="2.11.0+cu130", cuda="13.0")
    got = run_gpu(monkeypatch, FakeNvml([FakeGpu(), FakeGpu()]), site)
    assert {k: f.severity for k, f in got.items()} == {
        "gpu.driver": Severity.OK,
        "gpu.arch": Severity.OK,
        "gpu.memory": Severity.OK,
    }


def test_cu13_wheel_on_driver_570_fails(monkeypatch: pytest.MonkeyPatch, site: FakeSite) -> None:
    site.add_torch(version="2.11.0+cu130", cuda="13.0")
    got = run_gpu(monkeypatch, FakeNvml([FakeGpu()], driver="570.86.10", cuda=12080), site)
    assert got["gpu.driver_too_old"].severity is Severity.FAIL
    assert "580" in got["gpu.driver_too_old"].summary
    assert "cu128" in (got["gpu.driver_too_old"].remedy or "")


def test_driver_cuda_older_minor_warns(monkeypatch: pytest.MonkeyPatch, site: FakeSite) -> None:
    site.add_torch(version="2.9.0+cu129", cuda="12.9")
    got = run_gpu(monkeypatch, FakeNvml([FakeGpu()], driver="560.35.03", cuda=12060), site)
    assert got["gpu.driver_cuda"].severity is Severity.WARN


def test_v100_on_cu130_wheel_fails_arch(monkeypatch: pytest.MonkeyPatch, site: FakeSite) -> None:
    site.add_torch(version="2.11.0+cu130", cuda="13.0")
    got = run_gpu(monkeypatch, FakeNvml([FakeGpu("Tesla V100-SXM2-32GB", (7, 0))]), site)
    assert got["gpu.arch"].severity is Severity.FAIL
    assert "sm_70" in got["gpu.arch"].summary


def test_arch_binary_compatibility_within_major() -> None:
    from checks.gpu import arch_supported

    assert arch_supported((8, 9), ["sm_80", "sm_86"])  # L40S runs sm_86 cubins
    assert not arch_supported((7, 0), ["sm_75", "sm_80"])
    assert arch_supported((12, 1), ["sm_90", "compute_120"])  # PTX JITs forward


def test_held_and_full_gpu_warn(monkeypatch: pytest.MonkeyPatch, site: FakeSite) -> None:
    site.add_torch(version="2.11.0+cu130", cuda="13.0")
    busy = FakeGpu(free=3 * GIB, pids=[(31337, 138 * GIB)])
    got = run_gpu(monkeypatch, FakeNvml([FakeGpu(), busy]), site)
    assert got["gpu.memory.held"].severity is Severity.WARN
    assert "31337" in got["gpu.memory.held"].summary
    assert got["gpu.memory.low"].severity is Severity.WARN
    assert "gpu.memory" not in got


def test_missing_nvml_library_reads_as_pynvml_puts_it() -> None:
    """Without libnvidia-ml.so.1 the binding is not imported; the reason is pynvml's own words."""
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        pytest.skip("this machine has an NVIDIA driver")
    except OSError:
        pass
    import pynvml

    with pytest.raises(pynvml.NVMLError) as real:
        pynvml.nvmlInit()
    found = gpus.probe_gpus()
    assert isinstance(found, gpus.GpuUnavailable)
    assert str(found) == f"NVML cannot start: {real.value}"
