"""Where a run's metrics go besides `metrics.jsonl`: TensorBoard event files and Weights & Biases.

Every numeric field of a metrics line becomes one scalar with the same name (lists by index, tables by key:
`accuracy/3`, `heldout/accept_len`), so whatever the trainer writes to the JSONL is what the curves show, and a
field added later shows up with no change here. Both are optional extras: a config that asks for one that is not
installed is refused before anything starts, with the command that installs it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol


def scalars_of(row: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Every finite number in a metrics line, flattened: {"loss": .., "accuracy/1": .., "heldout/accept_len": ..}.
    `step` is the x axis, not a scalar; booleans and strings are left out."""
    out: dict[str, float] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if not prefix and key == "step":
            continue
        if isinstance(value, bool) or value is None or isinstance(value, str):
            continue
        if isinstance(value, int | float):
            if math.isfinite(value):
                out[name] = float(value)
        elif isinstance(value, dict):
            out |= scalars_of(value, f"{name}/")
        elif isinstance(value, list | tuple):
            out |= scalars_of({str(i): v for i, v in enumerate(value)}, f"{name}/")
    return out


class MetricSink(Protocol):
    def write(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class TensorBoardSink:
    """Event files in `<output>/tensorboard/` (`tensorboard --logdir <output>`), through torch's own writer."""

    def __init__(self, log_dir: Path, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: on resume, TensorBoard hides events past the resume step, as metrics.jsonl drops them.
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """A Weights & Biases run (`WANDB_MODE=offline` works with no network; `wandb sync` uploads it later)."""

    def __init__(
        self, project: str, run_dir: Path, name: str, config: dict[str, Any], resume_step: int
    ) -> None:
        import wandb

        run_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=name, dir=str(run_dir), config=config, resume="allow")
        self.resume_step = resume_step

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if step > self.resume_step:  # W&B refuses steps it has seen; resumed runs log from where they left
            self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


def open_sinks(
    output_dir: Path, tensorboard: bool, wandb_project: str | None, config: dict[str, Any], resume_step: int
) -> list[MetricSink]:
    """The sinks a run's `[output]` section asks for (none by default)."""
    sinks: list[MetricSink] = []
    if tensorboard:
        sinks.append(
            TensorBoardSink(output_dir / "tensorboard", purge_step=resume_step + 1 if resume_step else None)
        )
    if wandb_project:
        sinks.append(WandbSink(wandb_project, output_dir / "wandb", output_dir.name, config, resume_step))
    return sinks
