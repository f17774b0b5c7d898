"""The compile-cache analysis the `cache.*` checks and `cache status` share, computed once per run.

One walk of the cache folders (sizes, owners, modes, the build they were made for) and of the snapshot
store serves all four checks and the status command's table, so the table and the findings beside it are
about the same walk.
"""

from __future__ import annotations

from dflash_doctor.cache.fingerprint import fingerprint_of
from dflash_doctor.cache.status import CacheStatus, gather_status, start_walks
from dflash_doctor.context import CheckContext
from dflash_doctor.env.gpus import GpuInventory, gpu_inventory, start_gpu_probe

WALKS = "cache.walks"


def start_cache_walks(ctx: CheckContext) -> None:
    """The `cache.*` checks' starter: the folders' walks begin before any check runs."""
    environ = ctx.options.extra.get("cache_environ")
    ctx.start(WALKS, lambda: start_walks(environ))
    start_gpu_probe(ctx)  # the fingerprint names the machine's GPUs: NVML asked once, beside the checks


def cache_status(ctx: CheckContext) -> CacheStatus:
    """The cache folders and the store as this run sees them, walked once (`ctx.shared`).

    The launch gate sets `options.extra["cache_environ"]`: the environment the workers will get, so the
    verdict is about the folder they will compile into, not this shell's default.
    """
    gpus = ctx.shared("cache.gpu_names", lambda: gpu_names(ctx))
    environ = ctx.options.extra.get("cache_environ")
    return ctx.shared(
        "cache.status", lambda: gather_status(fingerprint_of(ctx.env, gpus), environ, ctx.started(WALKS))
    )


def gpu_names(ctx: CheckContext) -> tuple[str, ...] | None:
    """The machine's GPU names (as `cache.fingerprint.read_gpu_names` reads them), from the run's one NVML
    inventory: the probe `start_gpu_probe` began, shared with the `gpu.*` checks."""
    inventory = gpu_inventory(ctx)
    return tuple(d.name for d in inventory.host) if isinstance(inventory, GpuInventory) else None
