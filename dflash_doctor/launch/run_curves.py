"""A run's curves from its `metrics.jsonl`: a PNG (matplotlib, an optional extra) and text sparklines.

A curve says at a glance what a table does not: is the loss still falling, did the held-out acceptance flatten,
did throughput drop when the cache went cold. `runs show --plot` draws one run, `runs compare --plot` overlays two.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_base.atomic import write_bytes_atomic
from dflash_base.disk import writing
from dflash_base.errors import DoctorError
from trainer.runspec.outputs import metrics_path

SPARK = "▁▂▃▄▅▆▇█"

# (panel title, the metrics-line fields it draws, first found wins per run)
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("loss", ("loss",)),
    ("acceptance length", ("heldout_accept_len", "accept_len")),  # held-out vs the target when evaluated
    ("tok/s", ("tok_s",)),
)


@dataclass(frozen=True)
class Curves:
    """One run's series by field name, each a list of (step, value)."""

    label: str
    series: dict[str, list[tuple[int, float]]]
    # The steps where a field was NaN or infinite (a diverged run): left out of the series, and said.
    non_finite: dict[str, list[int]] = field(default_factory=dict)
    config: str | None = None  # the run's config file name, for the plot's title

    @property
    def title(self) -> str:
        """`run 3f2a (config smollm2-135m.toml)`: which run, trained with what."""
        return f"run {self.label}" + (f" (config {self.config})" if self.config else "")

    def get(self, *names: str) -> tuple[str, list[tuple[int, float]]] | None:
        for name in names:
            if self.series.get(name):
                return name, self.series[name]
        return None


def read_curves(metrics_path: Path, label: str, config: str | None = None) -> Curves:
    """Numeric top-level fields of every metrics line; damaged lines are skipped (a run killed mid-write)."""
    series: dict[str, list[tuple[int, float]]] = {}
    non_finite: dict[str, list[int]] = {}
    try:
        text = metrics_path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise DoctorError(f"{metrics_path}: cannot read the run's metrics ({exc.strerror})") from exc
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            continue
        for key, value in row.items():
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if key == "step" or not number:
                continue
            if math.isfinite(value):
                series.setdefault(key, []).append((row["step"], float(value)))
            else:
                non_finite.setdefault(key, []).append(row["step"])
    return Curves(label, series, non_finite, config)


def sparkline(values: list[float], width: int = 40) -> str:
    """The values resampled to `width` buckets (mean of each), drawn with eight block heights."""
    if not values:
        return ""
    if len(values) > width:
        step = len(values) / width
        values = [
            sum(chunk) / len(chunk)
            for i in range(width)
            if (chunk := values[int(i * step) : max(int((i + 1) * step), int(i * step) + 1)])
        ]
    low, high = min(values), max(values)
    span = high - low or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int((v - low) / span * len(SPARK)))] for v in values)


def sparkline_rows(curves: Curves) -> list[tuple[str, str, str]]:
    """(field, first -> last, sparkline) for each panel a run has data for; a field that was never a finite
    number keeps its row, saying so (a loss that went NaN at the first step must not vanish)."""
    rows = []
    for _, names in PANELS:
        found = curves.get(*names)
        if found:
            name, points = found
            values = [v for _, v in points]
            ended_bad = max(curves.non_finite.get(name, [0])) > points[-1][0]  # its last step was NaN
            last = "NaN" if ended_bad else f"{values[-1]:.4g}"
            rows.append((name, f"{values[0]:.4g} -> {last}", sparkline(values)))
            continue
        never = next((name for name in names if curves.non_finite.get(name)), None)
        if never is not None:
            rows.append((never, "NaN or infinite at every step", ""))
    return rows


def non_finite_notes(curves: Curves) -> list[str]:
    """One line per drawn field that was NaN or infinite at some steps: how many, and from which step."""
    notes = []
    for _, names in PANELS:
        for name in names:
            steps = curves.non_finite.get(name)
            if steps:
                total = len(steps) + len(curves.series.get(name, []))
                notes.append(
                    f"{name} is NaN or infinite at {len(steps)} of {total} steps, first at step {steps[0]}: "
                    "the curve leaves those steps out"
                )
    return notes


def plot_curves(runs: list[Curves], out: Path) -> Path:
    """One PNG with a panel per curve (loss, acceptance, tok/s), every run overlaid, titled with the runs and
    their configs. Rendered in memory, then written atomically: a full disk names `out` (NoSpace), and
    leaves no partial file."""
    try:
        import matplotlib
    except ImportError as exc:
        raise DoctorError(
            "--plot: needs matplotlib, which is not installed", hint="pip install 'dflash-doctor[plot]'"
        ) from exc
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    if out.suffix.lower() != ".png":
        raise DoctorError(f"--plot: {out} must end in .png")
    panels = [(title, names) for title, names in PANELS if any(run.get(*names) for run in runs)]
    if not panels:
        raise DoctorError("--plot: the run has no metrics yet (no step finished)")
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.6 * len(panels) + 0.4), sharex=True, squeeze=False)
    for ax, (title, names) in zip(axes[:, 0], panels, strict=True):
        for run in runs:
            found = run.get(*names)
            if found:
                name, points = found
                # a marker on every point: a series of one point (a single held-out evaluation) is a dot,
                # where a bare line drew nothing
                ax.plot(
                    [s for s, _ in points], [v for _, v in points], marker="o", markersize=3,
                    label=f"{run.label} ({name})",
                )  # fmt: skip
        ax.set_title(title, loc="left", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(plot_title(runs), fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    data = buffer.getvalue()
    with writing(out, len(data)):  # was: "a file: No space left on device", the path unnamed
        write_bytes_atomic(out, data)
    return out


def plot_title(runs: list[Curves]) -> str:
    """`run a (config x) and run b (config y)` for one or two runs; more would run off the figure, so they
    are counted, with their shared config when they have one (each run's label is in the legends)."""
    if len(runs) <= 2:
        return " and ".join(run.title for run in runs)
    configs = {run.config for run in runs}
    shared = configs.pop() if len(configs) == 1 else None
    return f"{len(runs)} runs" + (f" (config {shared})" if shared else "")


def curves_of(record: Any) -> Curves:
    """The curves of a run record (its output folder's metrics.jsonl), or an error saying why there are none."""
    folder = getattr(record, "output_dir", None)
    if not folder:
        raise DoctorError(f"run {record.id}: no output folder recorded (refused runs train nothing)")
    path = metrics_path(folder)
    if not path.is_file():
        raise DoctorError(f"run {record.id}: {path} is gone or was never written")
    config = getattr(record, "config_path", None)
    return read_curves(path, record.id, Path(config).name if config else None)
