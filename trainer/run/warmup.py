"""Compile and warm every compiled function in the main thread, before any loop or thread exists.

`warm_up(config)` is what `dflash-doctor cache warm` calls: it builds the drafter at the run's shapes with
the attention the run will use on this device, runs one forward+backward on a dummy batch and reports what
it compiled and how long it took. It needs no process group and no target weights (the frozen embedding
and head are zeros of the right shape: values do not change what gets compiled). For a colocated config
on CUDA it also captures once with the target there (seeded weights), so both roles' compiled layers are
in that device's cache. `train.py` calls `warm_up_model` (and `warm_up_target`) on the real models for the
same reason.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer.model.batch import CapturedBatch
from trainer.model.build import build_drafter
from trainer.model.device import autocast_for, hidden_dtype_for, resolve_device
from trainer.model.drafter import DFlashDrafter
from trainer.runspec.config import TrainConfig, load_config
from trainer.runspec.target_shapes import target_hf_config

if TYPE_CHECKING:
    from trainer.target_model.capture import CaptureTarget


def dummy_batch(cfg: TrainConfig, model: DFlashDrafter, device: torch.device) -> CapturedBatch:
    """A batch with the run's exact shapes and dtypes, every position supervised."""
    b, s = cfg.optim.batch_size, cfg.data.seq_len
    features = model.cfg.num_context_features * model.cfg.hidden_size
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.cfg.vocab_size - 1, (b, s), generator=gen)
    hidden = torch.randn(b, s, features, generator=gen).to(hidden_dtype_for(cfg, device))
    return CapturedBatch(ids.to(device), torch.ones(b, s, dtype=torch.bool, device=device), hidden.to(device))


def warm_up_model(model: DFlashDrafter, cfg: TrainConfig, device: torch.device) -> dict[str, Any]:
    """One forward+backward at the run's shapes in this (main) thread; leaves no gradients behind."""
    from torch._dynamo.utils import counters

    from trainer.model.anchors import sample_anchors

    torch._dynamo.config.fail_on_recompile_limit_hit = True
    batch = dummy_batch(cfg, model, device)
    gen = torch.Generator(device=device).manual_seed(0)
    began = time.perf_counter()
    anchors, valid = sample_anchors(batch.loss_mask, cfg.optim.anchors, cfg.drafter.block_size, gen)
    with autocast_for(cfg.precision, device):
        out = model(batch.input_ids, batch.loss_mask, batch.hidden, anchors, valid)
    out.loss.backward()
    model.zero_grad(set_to_none=True)
    if cfg.data.holds_out:
        warm_up_heldout(model, cfg, batch, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - began
    compiled = ["flex_attention"] if model.attention == "flex" else []
    if model.layers_compiled:
        compiled.append("decoder layers" + (" (training and held-out)" if cfg.data.holds_out else ""))
    if model.compile_loss:
        compiled.append("LM head + CE")
    return {
        "device": str(device),
        "attention": model.attention,
        "compiled": compiled,
        "seconds": round(seconds, 3),
        "shapes": {
            "batch_size": cfg.optim.batch_size,
            "seq_len": cfg.data.seq_len,
            "anchors": cfg.optim.anchors,
            "block_size": cfg.drafter.block_size,
        },
        "fxgraph_cache_hit": int(counters["inductor"]["fxgraph_cache_hit"]),
        "fxgraph_cache_miss": int(counters["inductor"]["fxgraph_cache_miss"]),
        "autograd_cache_hit": int(counters["aot_autograd"]["autograd_cache_hit"]),
        "autograd_cache_miss": int(counters["aot_autograd"]["autograd_cache_miss"]),
    }


def warm_up_heldout(
    model: DFlashDrafter, cfg: TrainConfig, batch: CapturedBatch, device: torch.device
) -> None:
    """The held-out scoring forward (eval mode, no grad), through the run's own `score_heldout`.

    Compiled layers guard on grad mode and `training`: without this, the first evaluation compiles a
    second layer graph in the middle of the run (measured on CPU: 3.8 s at tiny shapes; more on a GPU),
    and the launcher's warm-up child would not have put it in the cache for the next launch."""
    from trainer.run.heldout import score_heldout

    scored = CapturedBatch(batch.input_ids, batch.loss_mask, batch.hidden, target_ids=batch.input_ids)
    score_heldout(model, [scored], cfg.precision, cfg.optim.anchors, device)


def compile_lock_path() -> Path:
    """One lock per compile cache: ranks that share the cache take turns compiling into it."""
    import os
    import tempfile

    root = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or tempfile.gettempdir())
    return root.parent / f".{root.name}.dflash-compile.lock"


def warm_up_target(target: CaptureTarget, cfg: TrainConfig, device: torch.device) -> dict[str, Any]:
    """One capture at the run's shapes in this main thread, before any batch: the compile, if any.

    With compiled target layers every target rank compiles on its first capture (Inductor keys graphs by
    device index, so the launcher's drafter warm-up cannot serve them). The first rank to take the compile
    lock compiles alone; the others wait until it is done, then go together: by then the Triton kernels
    are in the shared cache (keyed by source, not device), so theirs is codegen only. From a warm cache
    this costs one load's wait, not one per rank.
    """
    from filelock import FileLock, Timeout

    began = time.perf_counter()
    ids = torch.zeros(cfg.optim.batch_size, cfg.data.seq_len, dtype=torch.long, device=device)
    lock = FileLock(str(compile_lock_path()))
    try:
        lock.acquire(timeout=0)
        first = True
    except Timeout:
        first = False
        with lock:  # wait for the first rank's compile to finish
            pass
    waited = time.perf_counter() - began
    try:
        target.capture(ids, torch.ones_like(ids, dtype=torch.bool), index=-1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    finally:
        if first:
            lock.release()
    return {
        "device": str(device),
        "first": first,
        "waited_s": round(waited, 3),
        "seconds": round(time.perf_counter() - began, 3),
    }


def warm_up(config: TrainConfig | str | Path, device: str | None = None) -> dict[str, Any]:
    """Build the drafter at the config's shapes and warm it; no process group, no target weights.

    A colocated config with compiled target layers on CUDA warms the target's capture on the same device
    first (its compiled layers share this device's cache with the drafter's), so no rank compiles at start.
    """
    cfg = config if isinstance(config, TrainConfig) else load_config(config)
    dev = resolve_device(device or cfg.run.device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)  # compiled graphs are keyed by device index: warm the one training uses
    target = warm_up_colocated_target(cfg, dev)
    hf_config = target_hf_config(cfg.target.path)
    shape = (int(hf_config.vocab_size), int(hf_config.hidden_size))
    frozen = torch.zeros(shape, device=dev)
    model = build_drafter(cfg, hf_config, frozen, frozen, dev)
    report = warm_up_model(model, cfg, dev)  # its compile counters include the target's
    return {**report, "target": target} if target is not None else report


def warm_up_colocated_target(cfg: TrainConfig, device: torch.device) -> dict[str, Any] | None:
    """Colocated + compiled target layers (CUDA): one capture at the run's shapes, as the trainer captures
    (no_grad, seeded weights: values do not change what compiles); then the target is freed. Else None."""
    from trainer.runspec.topology import resolve_topology
    from trainer.target_model.capture import capture_target_for

    if not (resolve_topology(cfg.topology).colocated and cfg.target.compile_layers and device.type == "cuda"):
        return None
    began = time.perf_counter()
    target = capture_target_for(cfg, device, colocated=True)
    built = time.perf_counter() - began
    report = {**warm_up_target(target, cfg, device), "build_s": round(built, 3)}
    target.close()
    del target
    import gc

    gc.collect()  # compiled layers' forwards refer back to their modules: a cycle, freed by the collector
    torch.cuda.empty_cache()
    return report
