"""A run whose steps slow down says what changed with them: the machine's samples (`trainer.run.telemetry`) and
the early/late comparison of the steady steps (`trainer.run.drift`), on fake NVML and CPU readings."""

from __future__ import annotations

from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from dflash_doctor.cli import run
from dflash_doctor.launch.runs import RunStore
from trainer.run.drift import step_drift
from trainer.run.steady import steady_window
from trainer.run.telemetry import MachineSampler, slowdown_names

CpuTimes = namedtuple("CpuTimes", "user system idle steal")
ProcTimes = namedtuple("ProcTimes", "user system")


class FakeCpu:
    """psutil's two readings, advanced by the test."""

    def __init__(self) -> None:
        self.machine = CpuTimes(100.0, 10.0, 1000.0, 0.0)
        self.own = ProcTimes(5.0, 1.0)

    def cpu_times(self) -> CpuTimes:
        return self.machine

    def Process(self) -> Any:  # psutil's name
        return SimpleNamespace(cpu_times=lambda: self.own)


def fake_nvml(reasons: int = 0, power_fails: bool = False) -> SimpleNamespace:
    def power(_: Any) -> int:
        if power_fails:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return 650_000

    return SimpleNamespace(
        nvmlClocksEventReasonSwPowerCap=0x4,
        nvmlClocksEventReasonHwSlowdown=0x8,
        nvmlClocksEventReasonSwThermalSlowdown=0x20,
        nvmlClocksEventReasonHwThermalSlowdown=0x40,
        nvmlClocksEventReasonHwPowerBrakeSlowdown=0x80,
        nvmlClocksEventReasonGpuIdle=0x1,
        NVML_CLOCK_SM=1,
        NVML_TEMPERATURE_GPU=0,
        nvmlDeviceGetClockInfo=lambda h, which: 1200,
        nvmlDeviceGetPowerUsage=power,
        nvmlDeviceGetTemperature=lambda h, which: 71,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: reasons,
    )


def test_the_sampler_reads_the_gpus_clock_and_slowdowns_and_the_hosts_cpu_since_the_last_sample() -> None:
    cpu = FakeCpu()
    sampler = MachineSampler(torch.device("cpu"), fake_nvml(reasons=0x4 | 0x1), cpu)
    sampler.handle = "gpu0"  # what nvml_handle finds for a CUDA device
    cpu.machine = CpuTimes(150.0, 20.0, 1020.0, 20.0)  # 100 s of host time, 20 of them stolen
    cpu.own = ProcTimes(5.09, 1.03)
    reading = sampler.sample()
    assert reading == {
        "sm_mhz": 1200, "gpu_w": 650.0, "gpu_c": 71, "gpu_slowdown": ["power cap"],
        "proc_cpu_s": pytest.approx(0.12), "cpu_steal": pytest.approx(0.2),
    }  # fmt: skip
    assert sampler.sample()["proc_cpu_s"] == 0  # nothing since the last sample
    assert slowdown_names(0x1, fake_nvml()) == []  # idle is not a slowdown


def test_a_reading_nvml_refuses_leaves_the_others_and_a_cpu_run_samples_the_host_only() -> None:
    sampler = MachineSampler(torch.device("cpu"), fake_nvml(power_fails=True), FakeCpu())
    sampler.handle = "gpu0"
    assert "gpu_w" not in sampler.sample() and sampler.sample()["sm_mhz"] == 1200
    on_cpu = MachineSampler(torch.device("cpu"), cpu=FakeCpu()).sample()
    assert set(on_cpu) == {"proc_cpu_s"}  # no GPU; no host time passed, so no steal share either


def lines(
    count: int, step_s: Any, machine: Any = None, tokens: Any = 10_000.0, wait: Any = 0.03
) -> list[dict]:
    """Metrics lines of a run with no evaluation: `step_s` etc. are values or functions of the step."""

    def at(value: Any, step: int) -> Any:
        return value(step) if callable(value) else value

    rows = []
    for step in range(1, count + 1):
        window = "first" if step == 1 else "last" if step == count else "pipelined"
        rows.append({
            "step": step, "step_time_s": at(step_s, step), "tokens": at(tokens, step), "tok_s": 1.0,
            "data_wait_s": at(wait, step), "window": window, "machine": at(machine, step),
        })  # fmt: skip
    return rows


def test_a_gpu_clocked_down_is_named_with_the_slowdown_nvml_reported() -> None:
    def machine(step: int) -> dict:
        slow = step > 60
        return {
            "sm_mhz": 1200 if slow else 1980,
            "gpu_slowdown": ["power cap"] if slow else [],
            "proc_cpu_s": 0.08,
        }

    records = lines(120, lambda s: 0.185 if s > 60 else 0.118, machine)
    drift = step_drift(records)
    assert drift is not None and drift["change"] == pytest.approx(0.185 / 0.118 - 1, rel=1e-3)
    finding = drift["finding"]
    assert "took 57% longer" in finding and "median 185.0 ms against 118.0 ms" in finding
    assert "SM clock went from 1980 to 1200 MHz (power cap reported)" in finding
    assert "CPU time" not in finding and "steal" not in finding  # only what changed is named
    summary = steady_window(records)
    assert summary["agrees_with_median"] is False  # the figure over drifted steps is not the median step's


@pytest.mark.parametrize(
    ("machine", "tokens", "wait", "says"),
    [
        ({"proc_cpu_s": 0.08, "cpu_steal": 0.0}, 10_000.0, 0.03, "nothing sampled changed"),
        (lambda s: {"proc_cpu_s": 0.08, "cpu_steal": 0.25 if s > 60 else 0.01}, 10_000.0, 0.03, "took 25% of its CPU time (steal), from 1%"),
        (lambda s: {"proc_cpu_s": 0.12 if s > 60 else 0.08}, 10_000.0, 0.03, "CPU time a step went from 80.0 to 120.0 ms (more work"),
        (lambda s: {"gpu_w": 540.0 if s > 60 else 650.0}, 10_000.0, 0.03, "the GPU drew 540 W against 650 W (idler)"),
        (None, lambda s: 15_000.0 if s > 60 else 10_000.0, 0.03, "the steps held 50% more tokens"),
        (None, 10_000.0, lambda s: 0.05 if s > 60 else 0.03, "waiting for data went from 30.0 to 50.0 ms"),
        (None, 10_000.0, 0.03, "carry no machine samples"),
    ],
)  # fmt: skip
def test_each_change_beside_a_slowdown_is_named(machine: Any, tokens: Any, wait: Any, says: str) -> None:
    finding = step_drift(lines(120, lambda s: 0.15 if s > 60 else 0.12, machine, tokens, wait))["finding"]
    assert says in finding


def test_steps_that_kept_their_pace_or_too_few_to_compare_say_nothing() -> None:
    steady = lines(120, lambda s: 0.118 + 0.004 * (s % 3), {"sm_mhz": 1980})
    drift = step_drift(steady)
    assert drift is not None and drift["finding"] is None and abs(drift["change"]) < 0.1
    assert steady_window(steady)["agrees_with_median"] is True
    assert step_drift(lines(20, lambda s: 0.3 if s > 10 else 0.1)) is None


def test_the_launch_line_and_runs_show_carry_the_drift(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    drift = step_drift(lines(120, lambda s: 0.185 if s > 60 else 0.118, {"sm_mhz": 1980}))
    record = RunStore().create(
        "succeeded", exit_code=0, metrics={"steady_tok_s": 67054.0, "step_drift": drift}
    )
    assert record.drift_finding is not None and record.drift_finding.startswith("the steady steps drifted")
    assert run(["runs", "show", record.id]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "note: the steady steps drifted: steps 82-119 took 57% longer" in out
    assert RunStore().create("succeeded", metrics={"step_drift": None}).drift_finding is None
