"""The machine's NVIDIA driver and GPUs, read through NVML (nvidia-ml-py), as this process's CUDA sees them.

NVML is touched only in `read_gpus`, through a module-like `nvml` object, so tests hand in a fake
with the same function names. NVML is machine-wide: it lists every GPU of the host, whatever
`CUDA_VISIBLE_DEVICES` says. `probe_gpus` narrows that to the launch's view (`devices`: the GPUs torch
numbers `cuda:0..n-1`, in the variable's order, `visible_devices.py`) and keeps the host's (`host`) for what
is machine-wide (the driver, the lock, the compile cache's fingerprint).
`nvmlSystemGetCudaDriverVersion_v2` is used because v1 may invent a number when libcuda is missing.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from dflash_doctor.env.visible_devices import VARIABLE, resolve_visible


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
    mig: tuple[int, int] | None = None  # a MIG device: (GPU instance, compute instance) on GPU `index`

    @property
    def label(self) -> str:
        """`GPU 3`, or `GPU 3 MIG 1/0` for a MIG device: NVML's numbering, as `nvidia-smi` shows it."""
        return f"GPU {self.index}" + (f" MIG {self.mig[0]}/{self.mig[1]}" if self.mig else "")

    @property
    def sm(self) -> str:
        """`sm_90` for an H100/H200: the spelling of `torch.cuda.get_arch_list()`."""
        return f"sm_{self.capability[0]}{self.capability[1]}"


@dataclass(frozen=True)
class GpuInventory:
    """`devices`: what CUDA in this process sees, `devices[i]` being `cuda:i`; `host`: every GPU NVML lists."""

    driver_version: str
    cuda_driver_version: int  # NVML's integer, e.g. 13000 for CUDA 13.0
    devices: list[GpuDevice] = field(default_factory=list)
    host_devices: list[GpuDevice] | None = None  # None: the same as `devices` (no CUDA_VISIBLE_DEVICES)
    mig_devices: list[GpuDevice] = field(default_factory=list)  # MIG devices of MIG-enabled GPUs
    visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES as read; None when unset
    visibility_problem: str | None = None  # why the variable's list ended early, when it did

    @property
    def host(self) -> list[GpuDevice]:
        return self.devices if self.host_devices is None else self.host_devices

    @property
    def hidden(self) -> list[GpuDevice]:
        """Host GPUs CUDA_VISIBLE_DEVICES hides (a GPU one of whose MIG devices is visible is not hidden)."""
        shown = {d.index for d in self.devices}
        return [d for d in self.host if d.index not in shown]

    def visibility_facts(self) -> dict[str, Any]:
        """Evidence for a finding: the variable, and what it hid (empty when unset)."""
        if self.visible_devices is None:
            return {}
        facts: dict[str, Any] = {
            VARIABLE: self.visible_devices,
            "visible": [f"cuda:{i} = {d.label}: {d.name}" for i, d in enumerate(self.devices)],
            "hidden_by_" + VARIABLE: [f"{d.label}: {d.name}" for d in self.hidden],
        }
        if self.visibility_problem:
            facts["visibility_problem"] = self.visibility_problem
        return facts

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
            "host_devices": [asdict(d) | {"sm": d.sm} for d in self.host],
            "visible_devices": self.visible_devices,
            "visibility_problem": self.visibility_problem,
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
        migs: list[GpuDevice] = []
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
            migs.extend(_mig_devices(nvml, handle, devices[-1]))
        return GpuInventory(driver, cuda_version, devices, mig_devices=migs)
    except GpuUnavailable:
        raise
    except Exception as exc:
        raise GpuUnavailable(f"NVML query failed: {exc}") from exc
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _mig_devices(nvml: Any, handle: Any, parent: GpuDevice) -> list[GpuDevice]:
    """The MIG devices of a GPU in MIG mode (none otherwise, or where NVML cannot say): what a `MIG-…`
    entry of CUDA_VISIBLE_DEVICES names."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        if int(current) != 1:  # NVML_DEVICE_MIG_ENABLE
            return []
        slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except Exception:  # no MIG support (NVML_ERROR_NOT_SUPPORTED), an older binding
        return []
    found = []
    for slot in range(slots):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            memory = nvml.nvmlDeviceGetMemoryInfo(mig)
            found.append(
                replace(
                    parent,
                    name=_text(nvml.nvmlDeviceGetName(mig)),
                    uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                    total_bytes=int(memory.total),
                    free_bytes=int(memory.free),
                    used_bytes=int(memory.used),
                    processes=(),
                    mig=(
                        int(nvml.nvmlDeviceGetGpuInstanceId(mig)),
                        int(nvml.nvmlDeviceGetComputeInstanceId(mig)),
                    ),
                )
            )
        except Exception:  # an empty slot (NVML_ERROR_NOT_FOUND)
            continue
    return found


def launch_view(inventory: GpuInventory, visible_devices: str | None) -> GpuInventory:
    """The inventory as a CUDA process started with `CUDA_VISIBLE_DEVICES=visible_devices` sees it."""
    seen = resolve_visible(visible_devices, inventory.host, inventory.mig_devices)
    return replace(
        inventory,
        devices=list(seen.visible),
        host_devices=list(inventory.host),
        visible_devices=visible_devices,
        visibility_problem=seen.problem,
    )


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


def probe_gpus(environ: Mapping[str, str] | None = None) -> GpuInventory | GpuUnavailable:
    """The inventory as a process started with `environ` (default: ours) sees it, or the reason there is
    none (the caller turns it into a skip). Processes we start inherit our CUDA_VISIBLE_DEVICES."""
    try:
        nvml = _binding()
    except ImportError as exc:
        return GpuUnavailable(f"nvidia-ml-py is not installed: {exc}")
    try:
        inventory = read_gpus(nvml)
    except GpuUnavailable as reason:
        return reason
    return launch_view(inventory, (os.environ if environ is None else environ).get(VARIABLE))


def query_gpus() -> GpuInventory | None:
    """The inventory, or None when there is no driver (`.host` for the machine, `.devices` for CUDA's view)."""
    found = probe_gpus()
    return found if isinstance(found, GpuInventory) else None


GPUS = "gpus"  # the name of the probe `start_gpu_probe` starts and `gpu_inventory` takes


def start_gpu_probe(ctx: Any) -> None:
    """The `gpu.*` checks' starter: NVML asked in a forked child before any check runs (`probe_gpus` there,
    the answer sent back as plain data). Loading the driver's library and its first queries took 77-106 ms of
    the checks' own process on an H200 (S21); beside the other checks they cost it nothing, and this process
    never loads `libnvidia-ml` nor imports the binding."""
    from dflash_doctor.env.forked import start_job

    ctx.start(GPUS, lambda: start_job(_probe_as_plain))


def gpu_inventory(ctx: Any) -> GpuInventory | GpuUnavailable:
    """Memoised for one check run (`ctx.shared("gpus", ...)`): NVML is asked once, by the probe the checks'
    starter began when there is one."""

    def probe() -> GpuInventory | GpuUnavailable:
        started = ctx.started(GPUS)
        if started is None:
            return probe_gpus()
        return _from_plain(started.results()[0])

    result: GpuInventory | GpuUnavailable = ctx.shared(GPUS, probe)
    return result


def _probe_as_plain() -> tuple[Any, ...]:
    """`probe_gpus()` as tuples, strings and ints (what a forked child can send back)."""
    found = probe_gpus()
    if isinstance(found, GpuUnavailable):
        return ("unavailable", str(found))
    host = None if found.host_devices is None else [_device_as_plain(d) for d in found.host_devices]
    return (
        "inventory",
        found.driver_version,
        found.cuda_driver_version,
        [_device_as_plain(d) for d in found.devices],
        host,
        [_device_as_plain(d) for d in found.mig_devices],
        found.visible_devices,
        found.visibility_problem,
    )


def _from_plain(plain: tuple[Any, ...]) -> GpuInventory | GpuUnavailable:
    if plain[0] == "unavailable":
        return GpuUnavailable(plain[1])
    _, driver, cuda, devices, host, migs, visible, problem = plain
    return GpuInventory(
        driver,
        cuda,
        [_device(d) for d in devices],
        None if host is None else [_device(d) for d in host],
        [_device(d) for d in migs],
        visible,
        problem,
    )


def _device_as_plain(device: GpuDevice) -> tuple[Any, ...]:
    return (
        device.index,
        device.name,
        device.uuid,
        device.capability,
        device.total_bytes,
        device.free_bytes,
        device.used_bytes,
        tuple((p.pid, p.used_bytes) for p in device.processes),
        device.mig,
    )


def _device(plain: tuple[Any, ...]) -> GpuDevice:
    index, name, uuid, capability, total, free, used, processes, mig = plain
    return GpuDevice(
        index,
        name,
        uuid,
        (int(capability[0]), int(capability[1])),
        total,
        free,
        used,
        tuple(GpuProcess(pid, used_bytes) for pid, used_bytes in processes),
        None if mig is None else (int(mig[0]), int(mig[1])),
    )
