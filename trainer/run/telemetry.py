"""What the machine was doing at each step: the GPU's SM clock, power and temperature and what NVML says holds
its clock down; the host's CPU time this process used and the share other guests of the host took (steal).

A run whose steps slow down midway leaves its reason here. On one H200 (S14, BENCHMARKS 5.11) the SmolLM2
recipe's steps went from 118 ms to 167-199 ms after step ~2,250 with the same tokens a step, and its data
wait rose with them: a GPU clocked down (power cap, heat), a host whose CPUs other machines took, or a host
thread doing more work per step would each read the same from step times alone. Each metrics line carries one
sample (`machine`), taken when the line is written; `trainer.run.drift` compares the early and late steady
steps. The readings cost ~0.1 ms a step (four NVML queries and /proc/stat); any that fails is left out, and a
sampler that cannot reach NVML still samples the host: telemetry never stops a run.
"""

from __future__ import annotations

import contextlib
from typing import Any

import psutil
import torch

# NVML's clocks-event bits that slow the SM clock down, by the name a person reads (idle, sync boost and the
# application clock setting are not slowdowns). nvidia-ml-py's names, read off the module (older ones say
# `Throttle` instead of `Event`).
SLOWDOWN_BITS = {
    "SwPowerCap": "power cap",
    "HwSlowdown": "hardware slowdown",
    "HwPowerBrakeSlowdown": "power brake",
    "SwThermalSlowdown": "thermal (software)",
    "HwThermalSlowdown": "thermal (hardware)",
}


def slowdown_names(reasons: int, nvml: Any) -> list[str]:
    """The slowdowns set in an NVML clocks-event bit field, by name."""
    names = []
    for suffix, name in SLOWDOWN_BITS.items():
        bit = getattr(nvml, f"nvmlClocksEventReason{suffix}", None)
        if bit is None:
            bit = getattr(nvml, f"nvmlClocksThrottleReason{suffix}", 0)
        if bit and reasons & bit:
            names.append(name)
    return names


def nvml_handle(device: torch.device, nvml: Any) -> Any | None:
    """The NVML handle of the GPU torch calls `device`, found by its UUID (NVML numbers the host's GPUs, torch
    the ones CUDA_VISIBLE_DEVICES shows); None on a CPU, a MIG device or when NVML cannot be reached."""
    if device.type != "cuda":
        return None
    try:
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        nvml.nvmlInit()
        return nvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}" if not uuid.startswith("GPU-") else uuid)
    except Exception:  # no NVML, a MIG device's UUID, a driver NVML does not know: the GPU goes unsampled
        return None


class MachineSampler:
    """One reading of the GPU and the host per call; the host's CPU figures cover the time since the last call."""

    def __init__(self, device: torch.device, nvml: Any | None = None, cpu: Any = psutil) -> None:
        if nvml is None and device.type == "cuda":
            with contextlib.suppress(ImportError):
                import pynvml  # nvidia-ml-py, a dependency of dflash-doctor

                nvml = pynvml
        self.nvml, self.cpu = nvml, cpu
        self.handle = nvml_handle(device, nvml) if nvml is not None else None
        self.process = cpu.Process()
        self.last_machine = cpu.cpu_times()
        self.last_process = self.process.cpu_times()

    def sample(self) -> dict[str, Any]:
        """{"sm_mhz", "gpu_w", "gpu_c", "gpu_slowdown"} when the GPU can be read, and {"proc_cpu_s",
        "cpu_steal"}: this process's CPU seconds since the last sample, and the share of the host's CPU time
        in it that its hypervisor gave to other guests."""
        reading: dict[str, Any] = {}
        if self.handle is not None:
            reading |= self.gpu_reading()
        machine, process = self.cpu.cpu_times(), self.process.cpu_times()
        busy = process.user + process.system - self.last_process.user - self.last_process.system
        reading["proc_cpu_s"] = round(busy, 5)
        total = sum(machine) - sum(self.last_machine)
        stolen = getattr(machine, "steal", 0.0) - getattr(self.last_machine, "steal", 0.0)
        if total > 0:
            reading["cpu_steal"] = round(max(stolen, 0.0) / total, 4)
        self.last_machine, self.last_process = machine, process
        return reading

    def gpu_reading(self) -> dict[str, Any]:
        """Whatever of the GPU's clock, power, temperature and slowdowns NVML answers."""
        nvml: Any = self.nvml
        handle = self.handle
        reading: dict[str, Any] = {}
        queries = {
            "sm_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
            "gpu_w": lambda: round(nvml.nvmlDeviceGetPowerUsage(handle) / 1000, 1),
            "gpu_c": lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
            "gpu_slowdown": lambda: slowdown_names(current_reasons(nvml, handle), nvml),
        }
        for name, query in queries.items():
            with contextlib.suppress(Exception):  # one reading NVML refuses leaves the others
                reading[name] = query()
        return reading


def current_reasons(nvml: Any, handle: Any) -> int:
    """The clocks-event bit field (`Throttle` in older nvidia-ml-py)."""
    query = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if query is None:
        query = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(query(handle))
