"""gpu.*: NVML is faked at the binding boundary (the pynvml functions), nothing above it."""

from __future__ import annotations

from dataclasses import replace

import pytest

import dflash_doctor.env.gpus as gpus
from dflash_doctor.context import CheckContext
from dflash_doctor.findings import Finding, Severity
from dflash_doctor.registry import run_checks
from tests.conftest import env_for
from tests.fakeenv import FakeSite
from tests.fakenvml import GIB, FakeGpu, FakeMig, FakeNvml, h200s


@pytest.fixture(autouse=True)
def no_visible_devices_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine running the tests may set CUDA_VISIBLE_DEVICES; the fakes are read as unset unless a
    test sets it."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


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
    assert set(got) == {"gpu.driver", "gpu.arch", "gpu.memory", "gpu.visible"}
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
        "gpu.visible": Severity.OK,
    }
    assert (
        "unset" in got["gpu.visible"].summary
        and "hidden_by_CUDA_VISIBLE_DEVICES" not in got["gpu.memory"].evidence
    )


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


# --- CUDA_VISIBLE_DEVICES: the launch's view of the host's GPUs ------------------------------------------------


def host_of(nvml: FakeNvml) -> gpus.GpuInventory:
    return gpus.read_gpus(nvml)


def seen(value: str | None, nvml: FakeNvml | None = None) -> tuple[list[str], str | None]:
    """The labels CUDA would number cuda:0.. for `CUDA_VISIBLE_DEVICES=value` on 4 H200s, and the problem."""
    inv = gpus.launch_view(host_of(nvml or FakeNvml(h200s(4))), value)
    return [d.label for d in inv.devices], inv.visibility_problem


@pytest.mark.parametrize(
    ("value", "labels"),
    [
        (None, ["GPU 0", "GPU 1", "GPU 2", "GPU 3"]),  # unset: all
        ("2,1", ["GPU 2", "GPU 1"]),  # the variable's order, not NVML's
        (" 3 , 0", ["GPU 3", "GPU 0"]),  # spaces around an entry
        ("1gpu,2ampere", ["GPU 1", "GPU 2"]),  # read like strtoul
        ("GPU-30000000-aaaa-bbbb-cccc-000000000003,0", ["GPU 3", "GPU 0"]),  # a full UUID, then an index
        ("GPU-2", ["GPU 2"]),  # a unique prefix of a UUID
    ],
)
def test_visible_devices_follow_cudas_rules(value: str | None, labels: list[str]) -> None:
    assert seen(value) == (labels, None)


@pytest.mark.parametrize(
    ("value", "labels", "problem"),
    [
        ("", [], "empty"),  # set but empty: none
        ("0,2,-1,1", ["GPU 0", "GPU 2"], "'-1' is not an index"),  # the guide's example: -1 ends the list
        ("1,7,0", ["GPU 1"], "index 7 is not a GPU of this host (0-3)"),
        ("0,GPU-9", ["GPU 0"], "no GPU of this host has a UUID starting 'GPU-9'"),
        ("GPU-,1", [], "ambiguous"),  # `GPU-` starts every UUID: invalid at once
        ("0,1,0", [], "already in the list"),  # a repeat: no GPU at all
        ("2,GPU-2", [], "already in the list"),  # the same GPU by index and by UUID
    ],
)
def test_an_invalid_entry_ends_the_list(value: str, labels: list[str], problem: str) -> None:
    got, why = seen(value)
    assert got == labels
    assert why is not None and problem in why


def test_mig_devices_are_read_and_named_by_their_uuids() -> None:
    mig_gpu = FakeGpu(
        uuid="GPU-11111111-aaaa-bbbb-cccc-000000000001",
        migs=[FakeMig("MIG-aaaa0000-0000", 1, 0), FakeMig("MIG-bbbb0000-0000", 2, 0, free=5 * GIB)],
    )
    nvml = FakeNvml([FakeGpu(uuid="GPU-00000000-aaaa-bbbb-cccc-000000000000"), mig_gpu])
    host = host_of(nvml)
    assert [(m.index, m.mig, m.free_bytes) for m in host.mig_devices] == [
        (1, (1, 0), 17 * GIB),
        (1, (2, 0), 5 * GIB),
    ]
    assert seen(None, nvml)[0] == ["GPU 0", "GPU 1"]  # unset: the physical GPUs, as NVML lists them
    assert seen("MIG-bbbb", nvml) == (["GPU 1 MIG 2/0"], None)  # a MIG UUID prefix
    assert seen("MIG-GPU-11111111-aaaa-bbbb-cccc-000000000001/1/0", nvml) == (
        ["GPU 1 MIG 1/0"],
        None,
    )  # older form
    got, why = seen("MIG-GPU-11111111/3/0", nvml)
    assert got == [] and why is not None and "no MIG device 3/0" in why
    inv = gpus.launch_view(host, "MIG-bbbb")
    assert [d.label for d in inv.hidden] == ["GPU 0"]  # GPU 1 is partly visible through its MIG device
    assert inv.devices[0].free_bytes == 5 * GIB  # the launch sizes the MIG device, not its GPU


def test_probe_reads_the_variable_and_keeps_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus, "_binding", lambda: FakeNvml(h200s(4)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    inv = gpus.probe_gpus()
    assert isinstance(inv, gpus.GpuInventory)
    assert [d.index for d in inv.devices] == [3, 1] and len(inv.host) == 4
    assert [d.index for d in inv.hidden] == [0, 2]
    other = gpus.probe_gpus({"CUDA_VISIBLE_DEVICES": "0"})  # a child's environment, given
    assert isinstance(other, gpus.GpuInventory) and [d.index for d in other.devices] == [0]


def test_gpu_visible_warns_about_a_list_cuda_stops_reading(
    monkeypatch: pytest.MonkeyPatch, site: FakeSite
) -> None:
    site.add_torch(version="2.11.0+cu130", cuda="13.0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,4,0")  # a 4-GPU host: 4 is invalid, 0 never read
    got = run_gpu(monkeypatch, FakeNvml(h200s(4)), site)
    bad = got["gpu.visible.ignored_entries"]
    assert bad.severity is Severity.WARN and "index 4" in bad.summary and "cuda:0 = GPU 1" in bad.summary
    assert bad.evidence["hidden_by_CUDA_VISIBLE_DEVICES"] == [
        "GPU 0: NVIDIA H200",
        "GPU 2: NVIDIA H200",
        "GPU 3: NVIDIA H200",
    ]
    assert "gpu.visible" not in got


def test_gpu_visible_warns_when_every_gpu_is_hidden_and_the_driver_is_still_judged(
    monkeypatch: pytest.MonkeyPatch, site: FakeSite
) -> None:
    site.add_torch(version="2.11.0+cu130", cuda="13.0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    got = run_gpu(monkeypatch, FakeNvml(h200s(2), driver="570.86.10", cuda=12080), site)
    assert got["gpu.visible.none"].severity is Severity.WARN
    assert got["gpu.driver_too_old"].severity is Severity.FAIL  # the host's driver, whatever is visible
    assert got["gpu.arch"].severity is Severity.SKIP and "hides every GPU" in got["gpu.arch"].summary
    assert got["gpu.memory"].severity is Severity.SKIP


def test_memory_is_judged_on_the_visible_gpus_and_names_the_hidden(
    monkeypatch: pytest.MonkeyPatch, site: FakeSite
) -> None:
    """Another user's job fills GPU 0; this shell's launches use GPUs 2 and 3 only: quiet, the hidden named."""
    site.add_torch(version="2.11.0+cu130", cuda="13.0")
    host = h200s(4)
    host[0] = replace(host[0], free=3 * GIB, pids=[(31337, 138 * GIB)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    got = run_gpu(monkeypatch, FakeNvml(host), site)
    assert (
        got["gpu.visible"].severity is Severity.OK
        and "cuda:0 = GPU 2, cuda:1 = GPU 3" in got["gpu.visible"].summary
    )
    quiet = got["gpu.memory"]
    assert quiet.severity is Severity.OK and "2 hidden by CUDA_VISIBLE_DEVICES" in quiet.summary
    assert quiet.evidence["hidden_by_CUDA_VISIBLE_DEVICES"] == ["GPU 0: NVIDIA H200", "GPU 1: NVIDIA H200"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,3")
    fired = run_gpu(monkeypatch, FakeNvml(host), site)
    assert fired["gpu.memory.held"].severity is Severity.WARN and "GPU 0" in fired["gpu.memory.held"].summary


def test_the_compile_cache_fingerprint_names_the_hosts_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A snapshot is of the machine: narrowing CUDA_VISIBLE_DEVICES must not make it look incompatible."""
    from dflash_doctor.cache.fingerprint import read_gpu_names

    host = h200s(3)
    host[2] = FakeGpu("NVIDIA H100", uuid="GPU-h100")
    monkeypatch.setattr(gpus, "_binding", lambda: FakeNvml(host))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert read_gpu_names() == ("NVIDIA H200", "NVIDIA H200", "NVIDIA H100")


def test_a_started_probe_answers_as_one_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The `gpu.*` starter asks NVML in a forked child: the inventory it sends back (MIG devices, processes,
    the variable's view and its problem) is the one this process would read; so is the reason there is none."""
    from dflash_doctor.env import forked

    monkeypatch.setattr(forked, "thread_count", lambda: 1)  # whatever the test runner started: fork here
    host = h200s(3, pids=[(4242, 3 * GIB), (77, None)])
    host[1] = replace(host[1], migs=[FakeMig("MIG-aaaa0000-0000", 1, 0), FakeMig("MIG-bbbb0000-0000", 2, 0)])
    monkeypatch.setattr(gpus, "_binding", lambda: FakeNvml(host))
    for visible in (None, "2,MIG-bbbb,nonsense"):
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        ctx = CheckContext(env_for())
        gpus.start_gpu_probe(ctx)
        assert ctx._started[gpus.GPUS].children == 1  # asked in a child, before anyone wanted it
        assert gpus.gpu_inventory(ctx) == gpus.probe_gpus()
    monkeypatch.setattr(gpus, "_binding", gpus._NoNvmlLibrary)
    ctx = CheckContext(env_for())
    gpus.start_gpu_probe(ctx)
    found, here = gpus.gpu_inventory(ctx), gpus.probe_gpus()
    assert isinstance(found, gpus.GpuUnavailable) and str(found) == str(here)


def test_the_cache_and_gpu_checks_ask_nvml_once(monkeypatch: pytest.MonkeyPatch, site: FakeSite) -> None:
    """The compile cache's fingerprint names the machine's GPUs from the same inventory as `gpu.*` (NVML's start
    cost ~80-100 ms on an H200 each time it was asked, S21)."""
    from dflash_doctor.audit.cache import cache_status
    from dflash_doctor.env import forked

    monkeypatch.setattr(forked, "can_fork", lambda: False)  # the probe runs here, where its calls are counted
    nvml = FakeNvml(h200s(2))
    starts: list[int] = []
    real_init = nvml.nvmlInit
    monkeypatch.setattr(nvml, "nvmlInit", lambda: starts.append(1) or real_init())
    monkeypatch.setattr(gpus, "_binding", lambda: nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # the fingerprint is the machine's, whatever is visible
    ctx = CheckContext(env_for(site))
    run_checks(ctx, ["cache", "gpu"])
    assert starts == [1]
    assert cache_status(ctx).current.gpu_names == ("NVIDIA H200", "NVIDIA H200")
