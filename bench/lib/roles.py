"""Build each trainer role at a recipe's shapes through the trainer's own code, and time it properly.

The benchmarks measure OUR path: the target is `trainer.target_model.tiny.build_embedded_target` cut by
`trainer.target_model.capture.CaptureTarget` (what `load_capture_target` does for an embedded target), the drafter is
`trainer.run.warmup.build_drafter`, and one drafter step is `trainer.run.train.train_step` (anchors, forward,
backward, grad clip, fused AdamW on CUDA, schedule). A recipe is a trainer config (shipped name or path)
plus `--set` overrides, so a benchmark and a run cannot disagree about the shapes.

Timing (`time_repeats`, docs/gpu-bench.md "How every number is timed"): untimed warm-up calls, then CUDA
events around each repeat, the median reported; on CPU, the host clock.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.model.batch import CapturedBatch
from trainer.model.build import build_drafter
from trainer.model.device import target_dtype
from trainer.model.drafter import DFlashDrafter
from trainer.run.optim import build_optimizer, build_scheduler
from trainer.run.train import train_step
from trainer.runspec.config import TrainConfig, load_config
from trainer.runspec.target_shapes import target_hf_config

RESULTS = Path(__file__).resolve().parents[1] / "results"


@dataclass
class Recipe:
    """A trainer config at the shapes one benchmark row runs."""

    name: str
    cfg: TrainConfig
    hf_config: Any
    source: str = ""  # the config name or path it was loaded from
    overrides: tuple[str, ...] = ()  # the section.key=value overrides applied to it

    @classmethod
    def load(cls, config: str, overrides: list[str], device: torch.device) -> Recipe:
        applied = (*overrides, f'run.device="{device.type}"')
        cfg = load_config(config, list(applied))
        name = Path(config).name.removesuffix(".toml")
        return cls(name, cfg, target_hf_config(cfg.target.path), config, applied)

    @property
    def seq_len(self) -> int:
        return self.cfg.data.seq_len

    @property
    def batch(self) -> int:
        return self.cfg.optim.batch_size

    def shapes(self) -> dict[str, Any]:
        return {
            "target": self.cfg.target.path,
            "seq_len": self.seq_len,
            "batch_size": self.batch,
            "anchors": self.cfg.optim.anchors,
            "block_size": self.cfg.drafter.block_size,
            "drafter_layers": self.cfg.drafter.layers,
            "target_layer_ids": self.cfg.drafter.target_layer_ids,
            "loss_chunk": self.cfg.drafter.loss_chunk,
        }


# ---------------------------------------------------------------- timing


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_repeats(fn: Callable[[], Any], device: torch.device, warmup: int, repeats: int) -> list[float]:
    """Seconds per call of `fn`, one entry per repeat, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    seconds = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1000)
        else:
            began = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - began)
    return seconds


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def peak_gib(device: torch.device) -> float | None:
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


# ---------------------------------------------------------------- inputs


def random_ids(recipe: Recipe, device: torch.device, seed: int) -> torch.Tensor:
    """Random token ids (never all zeros: every row the same token is not a batch a run sees), below the mask
    token so no input is the mask."""
    gen = torch.Generator(device=device).manual_seed(seed)
    vocab = int(recipe.hf_config.vocab_size)
    return torch.randint(0, vocab - 1, (recipe.batch, recipe.seq_len), device=device, generator=gen)


def random_batch(recipe: Recipe, model: DFlashDrafter, device: torch.device, seed: int) -> CapturedBatch:
    """A captured batch with the run's shapes and dtypes (hidden states in the target's dtype)."""
    ids = random_ids(recipe, device, seed)
    features = model.cfg.num_context_features * model.cfg.hidden_size
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    hidden = torch.randn(recipe.batch, recipe.seq_len, features, device=device, generator=gen)
    loss_mask = torch.ones_like(ids, dtype=torch.bool)
    return CapturedBatch(ids, loss_mask, hidden.to(target_dtype(recipe.cfg.target.dtype, device)), 0)


# ---------------------------------------------------------------- the drafter role


def frozen_weights(recipe: Recipe, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Stand-ins for the target's embedding and LM head (two tensors, as in a run), drawn on the device:
    the values do not change the speed, and drawing 2 x 622M values on the host takes seconds."""
    gen = torch.Generator(device=device).manual_seed(recipe.cfg.run.seed)
    shape = (int(recipe.hf_config.vocab_size), int(recipe.hf_config.hidden_size))
    embed = torch.randn(shape, device=device, generator=gen) * 0.02
    return embed, torch.randn(shape, device=device, generator=gen) * 0.02


@dataclass
class DrafterRole:
    """A drafter with its optimiser and schedule, ready to run `train_step` like a drafter rank does."""

    recipe: Recipe
    model: DFlashDrafter
    optimizer: torch.optim.Optimizer
    scheduler: Any
    anchor_gen: torch.Generator
    device: torch.device

    @classmethod
    def build(
        cls,
        recipe: Recipe,
        device: torch.device,
        frozen: tuple[torch.Tensor, torch.Tensor] | None = None,
        optimizer: Callable[[DFlashDrafter], torch.optim.Optimizer] | None = None,
    ) -> DrafterRole:
        embed, lm_head = frozen_weights(recipe, device) if frozen is None else frozen
        with torch.device(device):  # parameters are drawn on the device: the same init, seconds faster
            model = build_drafter(recipe.cfg, recipe.hf_config, embed, lm_head, device)
        optim = optimizer(model) if optimizer else build_optimizer(model, recipe.cfg.optim, device)
        scheduler = build_scheduler(optim, recipe.cfg.optim, total_steps=10_000)
        gen = torch.Generator(device=device).manual_seed(recipe.cfg.run.seed + 7)
        return cls(recipe, model, optim, scheduler, gen, device)

    def step(self, batch: CapturedBatch) -> float:
        """One training step exactly as a drafter rank runs it (without DDP: one drafter); the loss."""
        returned = train_step(
            self.model,
            self.model,
            [batch],
            self.recipe.cfg,
            self.anchor_gen,
            self.optimizer,
            self.scheduler,
            self.device,
        )
        outs = returned[0]  # ([LossOutput per micro-batch], grad norm, lr): only the loss is needed here
        return float(outs[-1].loss.detach())


def drafter_step_flops(recipe: Recipe, model: DFlashDrafter, device: torch.device) -> tuple[float, float]:
    """(model FLOPs of one step, mask density) at this recipe, the pairs counted from sampled anchors."""
    from bench.lib.flops import attended_pairs, model_flops
    from trainer.model.anchors import sample_anchors

    gen = torch.Generator(device=device).manual_seed(123)
    loss_mask = torch.ones(recipe.batch, recipe.seq_len, dtype=torch.bool, device=device)
    anchors, valid = sample_anchors(loss_mask, recipe.cfg.optim.anchors, model.cfg.block_size, gen)
    pairs = attended_pairs(anchors, valid, model.cfg.block_size)
    q_len = recipe.cfg.optim.anchors * model.cfg.block_size
    flops = model_flops(model.cfg, recipe.batch, recipe.seq_len, q_len, pairs)
    density = pairs / (recipe.batch * q_len * (recipe.seq_len + q_len))
    return flops, density


# ---------------------------------------------------------------- writing results


def print_rows(
    title: str, columns: tuple[str, ...] | list[str], rows: list[dict[str, Any]], width: int = 170
) -> None:
    """Every bench prints its rows the same way: one right-aligned column per key."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*(str(row.get(c)) for c in columns))
    Console(width=width).print(table)


def write_result(path: Path, data: dict[str, Any]) -> Path:
    """Write JSON beside, then rename: a benchmark killed by its timeout leaves the last complete file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(path.suffix + ".tmp")
    partial.write_text(json.dumps(data, indent=2, default=str) + "\n")
    partial.replace(path)
    return path


def describe_error(label: str, exc: BaseException) -> str:
    """One line for a failed row: what failed, why, and where (the innermost frames), kept short."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames))
    return f"{label}: {type(exc).__name__}: {str(exc)[:600]} [at {where}]"
