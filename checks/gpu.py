"""gpu.*: is the driver new enough for this torch wheel, are the GPUs in its arch list, are they free?

Read through NVML (machine-wide). Without a driver every check skips with NVML's reason.
A cu13 wheel on a driver < 580 prints "The NVIDIA driver on your system is too old" and silently
runs on the CPU; a GPU whose architecture the wheel has no kernels for fails at the first kernel.
The driver is judged for the host; architectures and memory for the GPUs CUDA_VISIBLE_DEVICES leaves
(what this shell's launches will use), the hidden ones named in the evidence (`gpu.visible`).
"""

from __future__ import annotations

from collections.abc import Iterator

from dflash_doctor.context import CheckContext
from dflash_doctor.env.gpus import GpuInventory, gpu_inventory, start_gpu_probe
from dflash_doctor.env.torch_build import TorchBuild
from dflash_doctor.env.visible_devices import VARIABLE
from dflash_doctor.findings import Finding, fail, ok, skip, warn
from dflash_doctor.registry import check

# Oldest driver branch per CUDA major (REFERENCE.md section 1).
DRIVER_FLOOR = {13: 580, 12: 525, 11: 450}

# Kernels shipped in the PyPI wheels, by CUDA version of the build. `check --deep` replaces this table
# with `torch.cuda.get_arch_list()` of the real build.
WHEEL_ARCHS: dict[str, list[str]] = {
    "13": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"],
    "12.8": ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"],
    "12.9": ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"],
    "12": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"],
    "11": ["sm_37", "sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86"],
}

LOW_FREE_FRACTION = 0.10


def _inventory(ctx: CheckContext, check_id: str, visible: bool = True) -> GpuInventory | Finding:
    """The inventory, or the skip that says why there is nothing to judge. `visible`: the check judges the
    GPUs CUDA will see, so a variable that hides them all is a skip too."""
    found = gpu_inventory(ctx)
    if not isinstance(found, GpuInventory):
        return skip(check_id, f"no NVIDIA driver to ask: {found}", reason=str(found))
    if not found.host:
        return skip(check_id, "the NVIDIA driver sees no GPU", driver=found.driver_version)
    if visible and not found.devices:
        return skip(
            check_id,
            f"{VARIABLE}={found.visible_devices!r} hides every GPU of this host (see gpu.visible)",
            **found.visibility_facts(),
        )
    return found


@check("gpu.visible", "GPUs CUDA will see", starts=start_gpu_probe)
def gpu_visible(ctx: CheckContext) -> Iterator[Finding]:
    inv = _inventory(ctx, "gpu.visible", visible=False)
    if isinstance(inv, Finding):
        yield inv
        return
    yield visibility_verdict(inv)


def visibility_verdict(inv: GpuInventory) -> Finding:
    """Pure: which host GPUs CUDA_VISIBLE_DEVICES leaves to CUDA, in torch's numbering; a list CUDA stops
    reading early (an invalid entry, a repeat, an empty value) is almost always a mistake."""
    facts = inv.visibility_facts()
    if inv.visible_devices is None:
        return ok("gpu.visible", f"{VARIABLE} is unset: all {len(inv.host)} GPU(s) are visible")
    order = ", ".join(f"cuda:{i} = {d.label}" for i, d in enumerate(inv.devices)) or "no GPU"
    hidden = ", ".join(d.label for d in inv.hidden) or "none"
    if inv.visibility_problem or not inv.devices:
        return warn(
            "gpu.visible.ignored_entries" if inv.devices else "gpu.visible.none",
            f"{VARIABLE}={inv.visible_devices!r}: {inv.visibility_problem or 'no GPU left'}; "
            f"CUDA sees {order} (hidden: {hidden})",
            remedy="list indices as nvidia-smi numbers them (0,1,...), or full UUIDs from `nvidia-smi -L`; "
            f"`unset {VARIABLE}` to use every GPU",
            **facts,
        )
    return ok("gpu.visible", f"{VARIABLE}={inv.visible_devices!r}: {order} (hidden: {hidden})", **facts)


@check("gpu.driver", "driver and CUDA", starts=start_gpu_probe)
def gpu_driver(ctx: CheckContext) -> Iterator[Finding]:
    inv = _inventory(ctx, "gpu.driver", visible=False)  # the driver serves every GPU of the host
    if isinstance(inv, Finding):
        yield inv
        return
    build = ctx.env.torch
    facts = {"driver": inv.driver_version, "driver_cuda": inv.cuda_driver, "gpus": len(inv.host)}
    yield from driver_verdicts(inv, build, facts)


def driver_verdicts(
    inv: GpuInventory, build: TorchBuild | None, facts: dict[str, object]
) -> Iterator[Finding]:
    """Pure: the driver against the wheel's CUDA (floor per major, then the NVML CUDA version)."""
    if build is None or build.cuda_major is None:
        yield ok(
            "gpu.driver",
            f"driver {inv.driver_version} (CUDA {inv.cuda_driver}); torch is not a CUDA build",
            **facts,
        )
        return
    facts["torch_cuda"] = build.cuda
    floor = DRIVER_FLOOR.get(build.cuda_major)
    major = inv.driver_major
    if floor is not None and major is not None and major < floor:
        yield fail(
            "gpu.driver_too_old",
            f"driver {inv.driver_version} is older than {floor}, the floor for CUDA {build.cuda_major}.x "
            f"wheels: torch {build.version} will say 'The NVIDIA driver on your system is too old' "
            "and run on the CPU",
            remedy=f"install an NVIDIA driver >= {floor}, or a torch wheel built for CUDA {inv.cuda_driver}: "
            f"pip install torch --index-url https://download.pytorch.org/whl/cu{inv.cuda_driver.replace('.', '')}",
            floor=floor,
            **facts,
        )
        return
    wheel = _cuda_tuple(build.cuda or "")
    have = (inv.cuda_driver_version // 1000, (inv.cuda_driver_version % 1000) // 10)
    if wheel and have < wheel:
        same_major = wheel[0] == have[0]
        verdict = warn if same_major else fail
        yield verdict(
            "gpu.driver_cuda",
            f"the driver runs CUDA up to {inv.cuda_driver}, torch was built for CUDA {build.cuda}"
            + (" (minor-version compatibility: PTX JIT and newer features may fail)" if same_major else ""),
            remedy="upgrade the NVIDIA driver to a branch that supports CUDA " + (build.cuda or ""),
            **facts,
        )
        return
    yield ok(
        "gpu.driver",
        f"driver {inv.driver_version} runs CUDA {inv.cuda_driver} >= torch's {build.cuda}",
        **facts,
    )


def _cuda_tuple(text: str) -> tuple[int, int] | None:
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def wheel_arch_list(build: TorchBuild) -> list[str] | None:
    """The documented arch list of the wheel family this build belongs to."""
    if build.cuda is None:
        return None
    major_minor = ".".join(build.cuda.split(".")[:2])
    return WHEEL_ARCHS.get(major_minor) or WHEEL_ARCHS.get(build.cuda.split(".")[0])


def arch_supported(capability: tuple[int, int], arch_list: list[str]) -> bool:
    """A cubin for sm_XY runs on sm_XZ with Z >= Y (same major); PTX (compute_XY) JITs forward."""
    major, minor = capability
    for arch in arch_list:
        kind, _, digits = arch.partition("_")
        digits = digits.rstrip("af")
        if not digits.isdigit() or len(digits) < 2:
            continue
        a_major, a_minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


@check("gpu.arch", "GPU architectures", starts=start_gpu_probe)
def gpu_arch(ctx: CheckContext) -> Iterator[Finding]:
    inv = _inventory(ctx, "gpu.arch")
    if isinstance(inv, Finding):
        yield inv
        return
    build = ctx.env.torch
    if build is None or build.cuda is None:
        yield skip("gpu.arch", "torch is not a CUDA build: no kernels to match against the GPUs")
        return
    arch_list, source = _deep_arch_list(ctx), "torch.cuda.get_arch_list() (deep probe)"
    if arch_list is None:
        arch_list, source = wheel_arch_list(build), f"documented table for CUDA {build.cuda} wheels"
    if arch_list is None:
        yield skip("gpu.arch", f"no known arch list for CUDA {build.cuda}; run `dflash-doctor check --deep`")
        return
    missing = [d for d in inv.devices if not arch_supported(d.capability, arch_list)]
    facts = {
        "arch_list": arch_list,
        "source": source,
        "gpus": [f"{d.index}: {d.name} ({d.sm})" for d in inv.devices],
        **inv.visibility_facts(),
    }
    if missing:
        names = ", ".join(f"{d.name} ({d.sm})" for d in missing)
        yield fail(
            "gpu.arch",
            f"torch {build.version} has no kernels for {names}",
            remedy="pip install torch --index-url https://download.pytorch.org/whl/cu126  # a build that lists "
            + ", ".join(sorted({d.sm for d in missing})),
            **facts,
        )
    else:
        yield ok("gpu.arch", f"every GPU's architecture is in torch's arch list ({source})", **facts)


def _deep_arch_list(ctx: CheckContext) -> list[str] | None:
    if not ctx.options.deep:
        return None
    from dflash_doctor.deep.run import deep_report

    arch = deep_report(ctx).cuda.get("arch_list")
    return list(arch) if isinstance(arch, list) and arch else None


@check("gpu.memory", "GPU memory", starts=start_gpu_probe)
def gpu_memory(ctx: CheckContext) -> Iterator[Finding]:
    inv = _inventory(ctx, "gpu.memory")
    if isinstance(inv, Finding):
        yield inv
        return
    yield from memory_verdicts(inv)


def memory_verdicts(inv: GpuInventory) -> Iterator[Finding]:
    """Pure: a GPU already mostly full, or held by processes, is a launch that may OOM."""
    quiet = True
    for dev in inv.devices:
        gib = 1 << 30
        facts = {
            "gpu": f"{dev.index}: {dev.name}",
            "free_gib": round(dev.free_bytes / gib, 2),
            "total_gib": round(dev.total_bytes / gib, 2),
            **inv.visibility_facts(),
        }
        if dev.processes:
            quiet = False
            pids = " ".join(str(p.pid) for p in dev.processes)
            yield warn(
                "gpu.memory.held",
                f"{dev.label} is held by {len(dev.processes)} process(es): {pids}",
                remedy=f"ps -o pid,user,etime,cmd -p {pids.replace(' ', ',')}  # then stop the strays",
                processes=[
                    {
                        "pid": p.pid,
                        "used_mib": None if p.used_bytes is None else round(p.used_bytes / (1 << 20), 1),
                    }
                    for p in dev.processes
                ],
                **facts,
            )
        if dev.total_bytes and dev.free_bytes / dev.total_bytes < LOW_FREE_FRACTION:
            quiet = False
            yield warn(
                "gpu.memory.low",
                f"{dev.label} has only {facts['free_gib']} of {facts['total_gib']} GiB free",
                remedy=f"nvidia-smi --id={dev.index} --query-compute-apps=pid,used_memory --format=csv",
                **facts,
            )
    if quiet:
        free = ", ".join(f"{d.index}: {d.free_bytes / (1 << 30):.1f} GiB" for d in inv.devices)
        hidden = f"; {len(inv.hidden)} hidden by {VARIABLE}" if inv.hidden else ""
        yield ok(
            "gpu.memory",
            f"{len(inv.devices)} GPU(s) free, no stray processes ({free}{hidden})",
            **inv.visibility_facts(),
        )
