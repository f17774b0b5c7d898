"""The machine's NVIDIA driver and GPUs, read through NVML (nvidia-ml-py).

NVML is touched only in `read_gpus`, through a module-like `nvml` object, so tests hand in a fake
with the same function names. NVML is machine-wide: the answer is the same for every interpreter.
`nvmlSystemGetCudaDriverVersion_v2` is used because v1 may invent a number when libcuda is missing.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU (what `nvidia-smi` lists under Processes)."""

    pid: int
    used_bytes: int | None


@dataclass(frozen=True)
class GpuDevice:
    index: int
    name: str
    uuid: str | None
    capability: tuple[int, int]
    total_bytes: int
    free_bytes: int
    used_bytes: int
    processes: tuple[GpuProcess, ...] = ()

    @property
    def sm(self) -> str:
        """`sm_90` for an H100/H200: the spelling of `torch.cuda.get_arch_list()`."""
        return f"sm_{self.capability[0]}{self.capability[1]}"


@dataclass(frozen=True)
class GpuInventory:
    driver_version: str
    cuda_driver_version: int  # NVML's integer, e.g. 13000 for CUDA 13.0
    devices: list[GpuDevice] = field(default_factory=list)

    @property
    def cuda_driver(self) -> str:
        """`13.0`: the newest CUDA this driver can run."""
        return f"{self.cuda_driver_version // 1000}.{(self.cuda_driver_version % 1000) // 10}"

    @property
    def driver_major(self) -> int | None:
        try:
            return int(self.driver_version.split(".")[0])
        except ValueError:
            return None

    def to_json(self) -> dict[str, Any]:
        return {
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "cuda_driver": self.cuda_driver,
            "devices": [asdict(d) | {"sm": d.sm} for d in self.devices],
        }


class GpuUnavailable(Exception):
    """No usable NVML (no driver, no library, no permission): the reason is the message."""


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def read_gpus(nvml: Any) -> GpuInventory:
    """Ask NVML everything the checks need. Raises GpuUnavailable when NVML cannot start."""
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, NoPermission...
        raise GpuUnavailable(f"NVML cannot start: {exc}") from exc
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda_version = int(nvml.nvmlSystemGetCudaDriverVersion_v2())
        devices = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                uuid: str | None = _text(nvml.nvmlDeviceGetUUID(handle))
            except Exception:
                uuid = None
            try:
                running = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except Exception:
                running = []
            processes = tuple(
                GpuProcess(int(p.pid), _used_memory(getattr(p, "usedGpuMemory", None))) for p in running
            )
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            devices.append(
                GpuDevice(
                    index=index,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    uuid=uuid,
                    capability=(int(major), int(minor)),
                    total_bytes=int(memory.total),
                    free_bytes=int(memory.free),
                    used_bytes=int(memory.used),
                    processes=processes,
                )
            )
        return GpuInventory(driver, cuda_version, devices)
    except GpuUnavailable:
        raise
    except Exception as exc:
        raise GpuUnavailable(f"NVML query failed: {exc}") from exc
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _used_memory(value: Any) -> int | None:
    """NVML reports 'not available' (e.g. inside containers) as None or as a huge sentinel."""
    if value is None:
        return None
    value = int(value)
    return None if value >= 2**63 else value


class _NoNvmlLibrary:
    """Stands in for pynvml where the driver's `libnvidia-ml.so.1` cannot be loaded: its `nvmlInit`
    fails as pynvml's does (NVML_ERROR_LIBRARY_NOT_FOUND), without importing the large binding first."""

    @staticmethod
    def nvmlInit() -> None:
        raise RuntimeError("NVML Shared Library Not Found")


def _binding() -> Any:
    """pynvml, whose `nvmlInit` starts by loading `libnvidia-ml.so.1` on Linux; when that load fails
    (no driver: CPU boxes, containers without GPUs) the stand-in answers the same (10-20 ms less)."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            return _NoNvmlLibrary
    import pynvml

    return pynvml


def probe_gpus() -> GpuInventory | GpuUnavailable:
    """The inventory, or the reason there is none (the caller turns it into a skip)."""
    try:
        nvml = _binding()
    except ImportError as exc:
        return GpuUnavailable(f"nvidia-ml-py is not installed: {exc}")
    try:
        return read_gpus(nvml)
    except GpuUnavailable as reason:
        return reason


def query_gpus() -> GpuInventory | None:
    """The inventory, or None when there is no driver (the launch gate's entry point)."""
    found = probe_gpus()
    return found if isinstance(found, GpuInventory) else None


def gpu_inventory(ctx: Any) -> GpuInventory | GpuUnavailable:
    """Memoised for one check run (`ctx.shared("gpus", ...)`): NVML is asked once."""
    result: GpuInventory | GpuUnavailable = ctx.shared("gpus", probe_gpus)
    return result
