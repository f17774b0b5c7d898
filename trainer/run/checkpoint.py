"""Checkpoints that a crash cannot tear, and that resume a run exactly.

Layout: `<output>/checkpoints/step_00000040/{state.pt, meta.json}`. A checkpoint is written into a temp
folder beside its final name (`.tmp-step_...`), every file fsynced, then renamed into place and the parent
fsynced: a folder named `step_*` is always complete. The last `keep` are kept. `state.pt` holds the
trainable weights, the optimiser and scheduler, the RNG states of every drafter rank (torch, CUDA, the
anchor generator, python), and the data position; `meta.json` the step and data position, for people and
for ranks that need only those.

A disk too full for the new checkpoint is one error (`dflash_base.disk.NoSpace`) naming the folder and the
bytes it needs, raised before anything is written when the space is missing already, else once the partial
temp folder is gone; the checkpoints written before it are untouched, so the run resumes from the last one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from dflash_base.atomic import fsync_dir, fsync_file
from dflash_base.disk import require_space, writing
from dflash_base.errors import ConfigError
from trainer.runspec.outputs import CHECKPOINT_META, CHECKPOINT_PREFIX, CHECKPOINT_STATE, CHECKPOINTS_DIR

if TYPE_CHECKING:
    from trainer.runspec.config import CheckpointSection
    from trainer.runspec.topology import Topology

PREFIX = CHECKPOINT_PREFIX


def checkpoints_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / CHECKPOINTS_DIR


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def save_checkpoint(
    output_dir: str | Path, step: int, state: dict[str, Any], meta: dict[str, Any], keep: int
) -> Path:
    """Write a checkpoint for `step` atomically, then drop all but the newest `keep`."""
    root = checkpoints_root(output_dir)
    final = root / checkpoint_name(step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    needed = state_bytes(state) + CHECKPOINT_OVERHEAD_BYTES
    with writing(final, needed, cleanup=lambda: shutil.rmtree(tmp, ignore_errors=True)):
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        require_space(final, needed)
        tmp.mkdir()
        torch.save(state, tmp / CHECKPOINT_STATE)
        (tmp / CHECKPOINT_META).write_text(
            json.dumps({"step": step, **meta}, indent=2, sort_keys=True) + "\n"
        )
        for name in (CHECKPOINT_STATE, CHECKPOINT_META):
            fsync_file(tmp / name)
        fsync_dir(tmp)
    if final.exists():  # a resumed run saving the same step again: replace the old copy
        stale = root / f".old-{final.name}-{os.getpid()}"
        final.rename(stale)
        shutil.rmtree(stale)
    tmp.rename(final)
    fsync_dir(root)
    prune_checkpoints(root, keep)
    return final


# What a checkpoint holds besides its tensors' bytes: torch.save's zip records, the pickled RNG states, the
# config, meta.json (a tiny-cpu checkpoint: 2,593,653 bytes on disk for 2,572,984 bytes of tensors).
CHECKPOINT_OVERHEAD_BYTES = 64 * 1024


def state_bytes(value: Any) -> int:
    """The bytes of every tensor in a (nested) state: what `torch.save` will write, give or take its records."""
    if isinstance(value, torch.Tensor):
        return value.nelement() * value.element_size()
    if isinstance(value, dict):
        return sum(state_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(state_bytes(v) for v in value)
    return 0


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint, oldest first (temp folders are never listed)."""
    root = checkpoints_root(output_dir)
    if not root.is_dir():
        return []
    found = []
    for folder in root.iterdir():
        if (
            folder.name.startswith(PREFIX)
            and (folder / CHECKPOINT_META).is_file()
            and (folder / CHECKPOINT_STATE).is_file()
        ):
            try:
                found.append((int(folder.name.removeprefix(PREFIX)), folder))
            except ValueError:
                continue
    return sorted(found)


def latest_checkpoint(output_dir: str | Path) -> tuple[int, Path] | None:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def prune_checkpoints(root: Path, keep: int) -> None:
    """Keep the newest `keep` checkpoints; remove temp folders a crash left behind."""
    for folder in root.iterdir():
        if folder.name.startswith((".tmp-", ".old-")):
            shutil.rmtree(folder, ignore_errors=True)
    for _, folder in list_checkpoints(root.parent)[:-keep]:
        shutil.rmtree(folder, ignore_errors=True)


def load_checkpoint(folder: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    return torch.load(folder / CHECKPOINT_STATE, map_location=map_location, weights_only=False)


# ---------------------------------------------------------------- what a training run saves and restores


@dataclass
class TrainState:
    """Everything of one drafter replica that a resumed run must get back exactly."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    anchor_gen: torch.Generator  # the anchors this replica samples


def _rng_state(anchor_gen: torch.Generator, device: torch.device) -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "anchor": anchor_gen.get_state(),
        "python": random.getstate(),
    }


class Checkpointer:
    """Decides when a run checkpoints (`checkpoint.every`, and after the last step) and writes and reads
    the training state; the loop only asks `due(step)` and calls `save`."""

    def __init__(
        self,
        section: CheckpointSection,
        output_dir: Path,
        *,
        grad_accum: int,
        config: dict[str, Any],
        topology: Topology,
        group: dist.ProcessGroup,
        index: int,
        total_steps: int,
    ) -> None:
        """`grad_accum`: `optim.grad_accum` (a step's batches, for the data position); `config`: the run's
        config as plain data (`TrainConfig.to_dict()`), saved in every checkpoint."""
        self.every, self.keep, self.output_dir = section.every, section.keep, output_dir
        self.grad_accum, self.config = grad_accum, config
        self.topology, self.group, self.index, self.total_steps = topology, group, index, total_steps

    def due(self, step_done: int) -> bool:
        return bool(self.every and step_done % self.every == 0) or step_done == self.total_steps

    def save(self, state: TrainState, step: int) -> None:
        """Gather every drafter's RNG state; the first drafter writes the checkpoint atomically."""
        topology = self.topology
        device = next(state.model.parameters()).device
        rng_states: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(rng_states, _rng_state(state.anchor_gen, device), group=self.group)
        if self.index != 0:
            return
        saved = {
            "model": state.model.state_dict(),
            "optimizer": state.optimizer.state_dict(),
            "scheduler": state.scheduler.state_dict(),
            "rng": rng_states,  # one entry per drafter rank, in drafter order
            "step": step,
            "next_batch": step * self.grad_accum * topology.drafters,
            "config": self.config,
        }
        # A colocated run on K ranks and a split with K drafters read the same batches: either resumes the other.
        meta = {"next_batch": saved["next_batch"], "drafters": topology.drafters, "mode": topology.mode}
        save_checkpoint(self.output_dir, step, saved, meta, self.keep)

    def restore(self, state: TrainState, step: int, device: torch.device) -> None:
        """Put weights, optimiser, schedule and this rank's RNG streams back as they were after `step`."""
        folder = checkpoints_root(self.output_dir) / checkpoint_name(step)
        saved = load_checkpoint(folder, map_location=device)
        drafters = self.topology.drafters
        if len(saved["rng"]) != drafters:
            raise ConfigError(
                f"topology.drafters: the checkpoint in {folder} was written by {len(saved['rng'])} drafters, "
                f"this run has {drafters}; resume with as many drafters (colocated: ranks) or a new output.dir"
            )
        state.model.load_state_dict(saved["model"])
        state.optimizer.load_state_dict(saved["optimizer"])
        state.scheduler.load_state_dict(saved["scheduler"])
        rng = saved["rng"][self.index]
        torch.set_rng_state(rng["torch"].cpu())
        if rng["cuda"] is not None and device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"].cpu(), device)
        state.anchor_gen.set_state(rng["anchor"].cpu())
        random.setstate(rng["python"])
