"""How long a launch will train, before it starts: its optimizer steps x one step's seconds, beside the memory
and disk plans (`train --dry-run` and the gate print it; the run record keeps it in its plan).

A CPU user had no hint of the cost until `eta 3411s` after step 1 (SmolLM2-135M on a 2-core box: 40-90 s a
step, weeks for the recipe's epochs; issue 39 U2). One step's seconds come from, best first:

1. `measured`: the steady window of an earlier run of the same config on this machine (same host, config text,
   `--set`s but those that only change how long it runs or where it writes, device type and topology): its
   summary's `steady_seconds / steady_step_count` (trainer/run/steady.py);
2. `projected` (CUDA): the per-role rates measured at these shapes (`split.py`, `role_rates.json`): the
   step's sequences over the topology's projected samples/s;
3. `declared`: a per-device figure shipped for a recipe at these shapes (`dflash_doctor/data/step_times.json`,
   seconds per sequence on one drafter rank, each entry naming the run it came from), scaled to this step's
   sequences;
4. none: said so, and the run's own eta after its first steps is the first figure.

The steps are `optim.steps`, or `optim.epochs` over the training data counted as the trainer counts it
(trainer/run/schedule.py: whole batches per epoch, whole steps). Evaluations, checkpoints and the compile
are not in the figure: the line says so.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_base.errors import DoctorError
from dflash_doctor.launch.memory_plan import PlanInputs
from dflash_doctor.launch.topology import TopologyChoice
from dflash_doctor.progress import elapsed_text

if TYPE_CHECKING:  # types only: the gate imports the config loader lazily (gate.load_training_config)
    from dflash_doctor.launch.runs import RunRecord
    from trainer.runspec.config import TrainConfig

DEFAULT_STEP_TIMES_PATH = Path(__file__).resolve().parents[1] / "data" / "step_times.json"


@dataclass(frozen=True)
class TimeEstimate:
    """The run's steps, one step's seconds and where that figure came from."""

    steps: int | None  # None: unknown (epochs over data that cannot be counted here)
    step_s: float | None  # None: no figure for this config on this device
    source: str  # "measured" | "projected" | "declared" | "none"
    basis: str  # where the step time came from, or why there is none
    steps_basis: str  # how the steps were counted

    @property
    def total_s(self) -> float | None:
        if self.steps is None or self.step_s is None:
            return None
        return self.steps * self.step_s

    def line(self) -> str:
        """`time: 2,262 steps x 65.0 s a step (measured: ...) = about 40h50m of training; ...`."""
        steps = f"{self.steps:,} steps ({self.steps_basis})" if self.steps is not None else self.steps_basis
        if self.step_s is None:
            return f"time: {steps}; no step time for this config on this device ({self.basis}): the run's eta after its first steps is the first figure"
        total = self.total_s
        head = f"time: {steps} x {step_text(self.step_s)} a step ({self.source}: {self.basis})"
        if total is None:
            return f"{head}; the total needs the step count"
        return f"{head} = about {elapsed_text(total)} of training steps (evaluations, checkpoints and the compile on top)"

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "step_s": round(self.step_s, 4) if self.step_s is not None else None,
            "total_s": round(self.total_s, 1) if self.total_s is not None else None,
            "source": self.source,
            "basis": self.basis,
            "steps_basis": self.steps_basis,
        }


def step_text(seconds: float) -> str:
    """`0.161 s`, `65.0 s`."""
    return f"{seconds:.3f} s" if seconds < 10 else f"{seconds:,.1f} s"


def planned_steps(cfg: TrainConfig, drafters: int) -> tuple[int | None, str]:
    """The run's optimizer steps and how they were counted (trainer/run/schedule.py's rule, from counts only)."""
    o = cfg.optim
    if o.steps is not None:
        return o.steps, "optim.steps"
    from dflash_base.errors import ConfigError
    from trainer.runspec.config import heldout_sequences, num_sequences

    try:
        total = num_sequences(cfg)
        held = heldout_sequences(cfg, total) if cfg.data.eval_path is None else 0
    except ConfigError as exc:
        return None, f"optim.epochs {o.epochs} over data not counted here: {exc.message}"
    per_epoch = (total - held) // o.batch_size
    steps = int(per_epoch * float(o.epochs or 0)) // (max(1, drafters) * o.grad_accum)
    return max(steps, 0), f"optim.epochs {o.epochs:g} over {total - held:,} training sequences"


def neutral(item: str) -> bool:
    """A `--set` that does not change one step's time: a BOOKKEEPING field's (how long the run goes on,
    where it writes; each field declares its effect: trainer.runspec.field_effects)."""
    from trainer.runspec.field_effects import keeps_step_time

    return keeps_step_time(item)


def step_sets(command: list[str]) -> list[str]:
    """The step-relevant `--set` items of a torchrun command, in order."""
    items = [command[i + 1] for i, arg in enumerate(command[:-1]) if arg == "--set"]
    return [item for item in items if not neutral(item)]


@dataclass(frozen=True)
class LaunchShape:
    """What a past run must share with this launch for its step time to be this launch's."""

    host: str
    config_text: str
    sets: list[str]
    device_type: str
    targets: int
    drafters: int
    mode: str


def measured_step(shape: LaunchShape, records: list[RunRecord]) -> tuple[float, str] | None:
    """The steady step time of the newest run of the same shape that has one, and which run it was."""
    for record in sorted(records, key=lambda r: r.created, reverse=True):
        plan = record.plan
        if (
            record.host != shape.host
            or record.config_text != shape.config_text
            or step_sets(record.command) != shape.sets
            or plan.get("device_type") != shape.device_type
            or plan.get("mode") != shape.mode
            or plan.get("targets") != shape.targets
            or plan.get("drafters") != shape.drafters
        ):
            continue
        seconds, count = record.metrics.get("steady_seconds"), record.metrics.get("steady_step_count")
        if isinstance(seconds, int | float) and isinstance(count, int) and count > 0 and seconds > 0:
            return float(
                seconds
            ) / count, f"run {record.id} of this config on this machine, {count:,} steady steps"
    return None


def projected_step(choice: TopologyChoice | None, sequences: int) -> tuple[float, str] | None:
    """One step's seconds from the role rates the topology choice projected, for the topology it chose."""
    if choice is None:
        return None
    t = choice.topology
    samples_s = None
    if t.colocated and choice.colocated is not None:
        samples_s = choice.colocated.samples_s
    elif (
        not t.colocated
        and choice.split is not None
        and (choice.split.targets, choice.split.drafters)
        == (
            t.targets,
            t.drafters,
        )
    ):
        samples_s = choice.split.samples_s
    if not samples_s:
        return None
    return (
        sequences / samples_s,
        f"{sequences:,} sequences a step at {samples_s:,.2f} samples/s from the role rates ({choice.rates_source})",
    )


@dataclass(frozen=True)
class DeclaredStep:
    """A shipped per-device figure: seconds per sequence on one drafter rank, at one recipe's shapes."""

    recipe: str
    device_type: str
    shape: dict[str, int]
    seconds_per_sequence: float
    source: str


def load_step_times(path: Path | None = None) -> list[DeclaredStep]:
    """The shipped table; empty when the file does not exist. A malformed one is a DoctorError naming it."""
    path = path or DEFAULT_STEP_TIMES_PATH
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise DoctorError(f"step times: cannot read {path}: {exc}", hint="restore the shipped file") from None
    out = []
    try:
        for entry in data["entries"]:
            out.append(
                DeclaredStep(
                    recipe=str(entry["recipe"]),
                    device_type=str(entry["device_type"]),
                    shape={k: int(v) for k, v in entry["shape"].items()},
                    seconds_per_sequence=float(entry["seconds_per_sequence"]),
                    source=str(entry["source"]),
                )
            )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DoctorError(
            f"step times: {path} is malformed ({exc!r})",
            hint="each entry needs recipe, device_type, shape, seconds_per_sequence, source",
        ) from None
    return out


def config_shape(cfg: TrainConfig, inputs: PlanInputs) -> dict[str, int]:
    """The numbers a declared step time is matched on: the target's size and the step's per-sequence work."""
    return {
        "target_hidden": inputs.target.hidden,
        "target_layers": inputs.target.layers,
        "target_vocab": inputs.target.vocab,
        "drafter_layers": inputs.drafter_layers,
        "seq_len": inputs.seq_len,
        "anchors": inputs.anchors,
        "block_size": inputs.block_size,
    }


def declared_step(
    cfg: TrainConfig, inputs: PlanInputs, device_type: str, table: list[DeclaredStep]
) -> tuple[float, str] | None:
    shape = config_shape(cfg, inputs)
    per_rank = cfg.optim.batch_size * cfg.optim.grad_accum
    for entry in table:
        if entry.device_type == device_type and entry.shape == shape:
            return per_rank * entry.seconds_per_sequence, (
                f"{entry.recipe}'s {entry.seconds_per_sequence:g} s a sequence per {device_type.upper()} rank "
                f"x {per_rank} sequences per rank a step; {entry.source}"
            )
    return None


def estimate_time(
    cfg: TrainConfig,
    inputs: PlanInputs,
    device_type: str,
    choice: TopologyChoice | None,
    config_text: str,
    command: list[str],
    records: list[RunRecord],
    table: list[DeclaredStep] | None = None,
    host: str | None = None,
) -> TimeEstimate:
    """The launch's training time: its steps x the best step time there is (measured, projected, declared)."""
    t = choice.topology if choice is not None else None
    targets = t.targets if t is not None else cfg.topology.targets or 1
    drafters = t.drafters if t is not None else cfg.topology.drafters or 1
    steps, steps_basis = planned_steps(cfg, drafters)
    shape = LaunchShape(
        host or socket.gethostname(),
        config_text,
        step_sets(command),
        device_type,
        targets,
        drafters,
        t.mode if t is not None else "split",
    )
    sequences = cfg.optim.batch_size * cfg.optim.grad_accum * drafters
    for source, found in (
        ("measured", lambda: measured_step(shape, records)),
        ("projected", lambda: projected_step(choice, sequences) if device_type == "cuda" else None),
        (
            "declared",
            lambda: declared_step(cfg, inputs, device_type, load_step_times() if table is None else table),
        ),
    ):
        figure = found()
        if figure is not None:
            return TimeEstimate(steps, figure[0], source, figure[1], steps_basis)
    why = "no run of it here yet, no role rates or declared step time at these shapes"
    return TimeEstimate(steps, None, "none", why, steps_basis)
