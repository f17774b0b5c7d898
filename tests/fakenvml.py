"""A fake of the pynvml functions `dflash_doctor.env.gpus` calls, answering like a real driver would.

Tests hand it to `gpus.read_gpus`, or put it behind `gpus._binding` so `probe_gpus` (and so the checks and the
launch gate) read it. GPUs may carry UUIDs and MIG devices for the CUDA_VISIBLE_DEVICES tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

GIB = 1 << 30


class NVMLError(Exception):
    pass


@dataclass
class FakeMig:
    uuid: str
    gpu_instance: int
    compute_instance: int
    name: str = "NVIDIA H200 MIG 1g.18gb"
    total: int = 18 * GIB
    free: int = 17 * GIB


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    cap: tuple[int, int] = (9, 0)
    total: int = 141 * GIB
    free: int = 140 * GIB
    pids: list[tuple[int, int | None]] = field(default_factory=list)
    uuid: str | None = None  # default: made from the name
    migs: list[FakeMig] = field(default_factory=list)  # MIG mode is on when there are some


def h200s(count: int, **overrides: object) -> list[FakeGpu]:
    """`count` H200s with distinct UUIDs `GPU-<i>0000000-...` (so a prefix like `GPU-3` names one)."""
    return [FakeGpu(uuid=f"GPU-{i}0000000-aaaa-bbbb-cccc-{i:012d}", **overrides) for i in range(count)]  # type: ignore[arg-type]


class FakeNvml:
    """The subset of pynvml that dflash_doctor.env.gpus calls."""

    MAX_MIG = 7

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

    def nvmlDeviceGetName(self, h: FakeGpu | FakeMig) -> bytes:
        return h.name.encode()

    def nvmlDeviceGetUUID(self, h: FakeGpu | FakeMig) -> str:
        return h.uuid or "GPU-" + h.name.replace(" ", "-")

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeGpu) -> tuple[int, int]:
        return h.cap

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu | FakeMig) -> SimpleNamespace:
        return SimpleNamespace(total=h.total, free=h.free, used=h.total - h.free)

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in h.pids]

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> tuple[int, int]:
        return (1, 1) if h.migs else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: FakeGpu) -> int:
        return self.MAX_MIG

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: FakeGpu, slot: int) -> FakeMig:
        if slot >= len(h.migs):
            raise NVMLError("Not Found")
        return h.migs[slot]

    def nvmlDeviceGetGpuInstanceId(self, h: FakeMig) -> int:
        return h.gpu_instance

    def nvmlDeviceGetComputeInstanceId(self, h: FakeMig) -> int:
        return h.compute_instance
