"""Estimate what a run will write to disk, before anything is launched: the plan's disk side.

Like the memory plan, a function of the config and the target's shapes: a checkpoint holds the drafter's
fp32 weights and AdamW's two fp32 moments (12 bytes per trainable parameter: `trainer/run/checkpoint.py`
saves `model`, `optimizer` and the RNG states, nothing of the frozen target), the export its weights in
`output.export_dtype`, `metrics.jsonl` one line per step. Checked against a real tiny-cpu run: 213,568
parameters, checkpoint 2,593,653 bytes on disk (estimate 2,644,736), export 433,831 (estimate 492,672).

A checkpoint is written beside the kept ones before the oldest is pruned, so at its peak a folder holds
`checkpoint.keep` + 1 of them (checkpoints already in the folder count towards the kept ones: a resumed
run writes fewer new ones). A new export is written beside the old one, then swapped in. After a
successful run the launcher snapshots the compile cache into the store (`DFLASH_DOCTOR_HOME`).

`launch.disk` (`checks/launch.py`) adds the writes up per file system and compares them with its free space.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_doctor.launch.memory_plan import PlanInputs, drafter_params
from trainer.runspec.outputs import CHECKPOINT_PREFIX, CHECKPOINT_STATE, CHECKPOINTS_DIR, EXPORT_DIR

if TYPE_CHECKING:  # types only: the gate imports the config loader lazily (gate.load_training_config)
    from trainer.runspec.config import TrainConfig

# fp32 weights + AdamW's exp_avg and exp_avg_sq, per trainable parameter (trainer/run/optim.py: AdamW).
CHECKPOINT_BYTES_PER_PARAM = 12
# Per drafter rank: torch's, the anchor generator's and python's RNG states (CPU: 10,112 bytes of tensors).
RNG_BYTES_PER_DRAFTER = 16 * 1024
# torch.save's zip records, the pickled config and meta.json (trainer.run.checkpoint.CHECKPOINT_OVERHEAD_BYTES).
CHECKPOINT_OVERHEAD_BYTES = 64 * 1024
# safetensors' header, config.json and README.md (trainer.model.export.EXPORT_OVERHEAD_BYTES).
EXPORT_OVERHEAD_BYTES = 64 * 1024
# One metrics.jsonl line (tiny-cpu, block 8: 517 bytes; longer blocks list more slot accuracies), rounded up;
# TensorBoard's events take about as much again when `output.tensorboard` is on.
METRICS_BYTES_PER_STEP = 1024
# A compile cache the warm-up has not filled yet: qwen3-8b-b16's on two H200s held 131.6 MB (1043 files),
# its snapshot 14.5 MB; tiny-cpu's 0.84 MB, snapshot 84 kB. A snapshot is counted at the cache's own size.
COLD_CACHE_BYTES = {"cuda": 160 * 1000**2, "cpu": 8 * 1000**2}


@dataclass(frozen=True)
class DiskWrite:
    """One thing the run writes: what, where (a folder), how many bytes at its peak, and how that was counted."""

    what: str
    path: str
    bytes: int
    detail: str
    each: int | None = None  # several of a kind (checkpoints): the bytes of one

    def to_json(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "path": self.path,
            "bytes": self.bytes,
            "each": self.each,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class DiskFacts:
    """What is on disk already: checkpoints in the output folder, the managed compile cache's size."""

    existing_checkpoints: int = 0
    cache_bytes: int = 0


def checkpoint_bytes(inputs: PlanInputs, drafters: int) -> int:
    """One checkpoint: the trainable parameters' fp32 weights and AdamW moments, the RNG states, records."""
    params = drafter_params(inputs)
    return params * CHECKPOINT_BYTES_PER_PARAM + drafters * RNG_BYTES_PER_DRAFTER + CHECKPOINT_OVERHEAD_BYTES


def export_bytes(inputs: PlanInputs, export_dtype: str) -> int:
    return drafter_params(inputs) * (4 if export_dtype == "fp32" else 2) + EXPORT_OVERHEAD_BYTES


def checkpoint_saves(steps: int | None, every: int) -> int | None:
    """How many checkpoints the run writes (`every` steps and after the last); None when steps are unknown."""
    if steps is None:
        return None
    if every == 0:
        return 1
    return steps // every + (1 if steps % every else 0)


def new_checkpoints_at_peak(keep: int, saves: int | None, existing: int) -> int:
    """The new checkpoints on disk at once at the peak: the kept ones not already there, plus the one being
    written (the oldest is pruned only after the new one is complete)."""
    if existing >= keep:
        return 1
    most = keep - existing + 1
    return most if saves is None else max(1, min(most, saves))


def estimate_disk(
    cfg: TrainConfig,
    inputs: PlanInputs,
    drafters: int,
    device_type: str,
    facts: DiskFacts,
    output_dir: Path,
    store_dir: Path,
    steps: int | None,
) -> list[DiskWrite]:
    """The run's writes at their peak (`steps`: the run's optimizer steps, None when the config gives epochs)."""
    one = checkpoint_bytes(inputs, drafters)
    keep, existing = cfg.checkpoint.keep, facts.existing_checkpoints
    saves = checkpoint_saves(steps, cfg.checkpoint.every)
    count = new_checkpoints_at_peak(keep, saves, existing)
    if existing >= keep:
        why = f"the one being written beside the {existing} already there"
    elif saves is not None and count == saves < keep - existing + 1:
        why = f"the run saves {saves}"
    else:
        why = f"checkpoint.keep {keep} + the one being written" + (
            f", {existing} already there" if existing else ""
        )
    out = str(output_dir)
    metrics_steps = steps if steps is not None else 0
    per_step = METRICS_BYTES_PER_STEP * (2 if cfg.output.tensorboard else 1)
    snapshot = max(facts.cache_bytes, COLD_CACHE_BYTES.get(device_type, COLD_CACHE_BYTES["cpu"]))
    return [
        DiskWrite(
            "checkpoints",
            str(output_dir / CHECKPOINTS_DIR),
            count * one,
            f"{count} x {one:,} bytes, fp32 weights + AdamW moments of {drafter_params(inputs):,} parameters: {why}",
            each=one,
        ),
        DiskWrite(
            "export",
            str(output_dir / EXPORT_DIR),
            export_bytes(inputs, cfg.output.export_dtype),
            f"{cfg.output.export_dtype} weights, written beside any earlier export before the swap",
        ),
        DiskWrite("metrics", out, metrics_steps * per_step, f"{metrics_steps} steps x {per_step} bytes"),
        DiskWrite(
            "compile-cache snapshot",
            str(store_dir),
            snapshot,
            "after a success, at most the managed compile cache's size"
            + (" (cold now: a full warm-up's)" if facts.cache_bytes < snapshot else ""),
        ),
    ]


def disk_facts(output_dir: Path, cache_dir: Path) -> DiskFacts:
    """Count the output folder's complete checkpoints and sum the managed compile cache's files."""
    existing = 0
    checkpoints = output_dir / CHECKPOINTS_DIR
    if checkpoints.is_dir():
        existing = sum(
            1
            for f in checkpoints.iterdir()
            if f.name.startswith(CHECKPOINT_PREFIX) and (f / CHECKPOINT_STATE).is_file()
        )
    return DiskFacts(existing, folder_bytes(cache_dir))


def folder_bytes(folder: Path) -> int:
    """The sizes of every regular file under `folder` (0 when it is missing); links are not followed."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                info = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            total += info.st_size
    return total
