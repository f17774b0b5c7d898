"""Checkpoints that a crash cannot tear, and that resume a run exactly.

Layout: `<output>/checkpoints/step_00000040/{state.pt, meta.json}`. A checkpoint is written into a temp
folder beside its final name (`.tmp-step_...`), every file fsynced, then renamed into place and the parent
fsynced: a folder named `step_*` is always complete. The last `keep` are kept. `state.pt` holds the
trainable weights, the optimiser and scheduler, the RNG states of every drafter rank (torch, CUDA, the
anchor generator, python), and the data position; `meta.json` the step and data position, for people and
for ranks that need only those.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from dflash_base.atomic import fsync_dir

PREFIX = "step_"


def checkpoints_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def save_checkpoint(
    output_dir: str | Path, step: int, state: dict[str, Any], meta: dict[str, Any], keep: int
) -> Path:
    """Write a checkpoint for `step` atomically, then drop all but the newest `keep`."""
    root = checkpoints_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state, tmp / "state.pt")
    (tmp / "meta.json").write_text(json.dumps({"step": step, **meta}, indent=2, sort_keys=True) + "\n")
    for name in ("state.pt", "meta.json"):
        _fsync_file(tmp / name)
    fsync_dir(tmp)
    if final.exists():  # a resumed run saving the same step again: replace the old copy
        stale = root / f".old-{final.name}-{os.getpid()}"
        final.rename(stale)
        shutil.rmtree(stale)
    tmp.rename(final)
    fsync_dir(root)
    prune_checkpoints(root, keep)
    return final


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint, oldest first (temp folders are never listed)."""
    root = checkpoints_root(output_dir)
    if not root.is_dir():
        return []
    found = []
    for folder in root.iterdir():
        if (
            folder.name.startswith(PREFIX)
            and (folder / "meta.json").is_file()
            and (folder / "state.pt").is_file()
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
    return torch.load(folder / "state.pt", map_location=map_location, weights_only=False)
