"""What a run reports: one JSONL line per step, live progress, and a final summary.

Written by the first drafter rank only. `metrics.jsonl` holds per step: step, loss, lr, grad_norm,
per-position accuracy (slot 0 is the anchor itself and always 0), the training batch's acceptance length
(measured per anchor, and the estimate implied by the accuracies), tok/s (real tokens: padding is not
counted) and supervised tok/s, samples/s over all drafters, the step time and the time spent waiting for
data, and the machine's reading (GPU clock, power, temperature, slowdowns; the host's CPU: `trainer.run.telemetry`);
on the steps that ran a held-out evaluation also the held-out acceptance length against the
target's greedy tokens (the headline: what a greedy server would see) and against the data labels, and
the evaluation's seconds. `summary.json` (steps, final loss, the last held-out figures, steady tok/s over whole pipelined
steps with the steps used and left out and whether it agrees with the median step, whether the steady steps
drifted and what changed with them (`trainer.run.drift`), exit status) is what the launcher reads when the run ends.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from dflash_base.atomic import write_bytes_atomic, write_json_atomic
from dflash_base.disk import NoSpace, writing
from trainer.run.drift import step_drift
from trainer.run.metric_sinks import MetricSink, scalars_of
from trainer.run.steady import PIPELINED, steady_window
from trainer.runspec.outputs import SUMMARY_FILE, read_metrics, summary_path


@dataclass
class StepMetrics:
    step: int  # 1-based: the number of optimiser steps done
    loss: float
    lr: float
    grad_norm: float
    accuracy: list[float]  # per block slot
    accept_len: float  # mean over valid anchors of 1 + leading correct slots
    accept_len_from_accuracy: float
    tok_s: (
        float  # real (non-padding) context tokens trained on per second (all drafters): tokens / step_time_s
    )
    supervised_tok_s: float  # tokens on the loss mask per second (all drafters)
    samples_s: float
    step_time_s: float  # from the previous step's end to this step's: its own capture included, no other's
    data_wait_s: float
    heldout_accept_len: float | None = None  # held-out, against the target's greedy tokens
    heldout_accept_len_labels: float | None = None  # held-out, against the data labels
    heldout_accept_len_last_answer: float | None = (
        None  # held-out, each sequence's last answer (what eval decodes)
    )
    heldout_s: float | None = None  # seconds the held-out evaluation took (not in step_time_s)
    heldout_sequences: int | None = None  # held-out sequences that evaluation scored (every one held out)
    tokens: float = (
        0.0  # real (non-padding) tokens of this step (all drafters): throughput = sum / sum of times
    )
    window: str = PIPELINED  # what its window held (trainer.run.steady): only `pipelined` ones are steady
    # the GPU's clock, power, temperature and slowdowns, the host's CPU (trainer.run.telemetry), when written
    machine: dict[str, Any] | None = None


class MetricsLog:
    """Append-only JSONL. On resume it first drops lines past the resume step, so each step appears once.

    Each line goes out in one unbuffered write: a disk that fills mid-line has the file cut back to its last
    whole line (a resume reads every line) and is one NoSpace error naming the file."""

    def __init__(self, path: Path, resume_step: int, sinks: Sequence[MetricSink] = ()) -> None:
        self.path = path
        self.sinks = list(sinks)  # TensorBoard, W&B: the same numbers as each JSONL line
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = [r for r in read_metrics(path) if r["step"] <= resume_step] if resume_step else []
        write_bytes_atomic(path, "".join(json.dumps(r) + "\n" for r in kept).encode())
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)  # held for the run, closed in close()

    def write(self, m: StepMetrics) -> None:
        row = asdict(m)
        data = (json.dumps(row) + "\n").encode()
        whole = os.fstat(self._fd).st_size
        with writing(self.path, len(data), cleanup=lambda: os.ftruncate(self._fd, whole)):
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
        scalars = scalars_of(row)
        for sink in self.sinks:
            sink.write(m.step, scalars)

    def close(self) -> None:
        os.close(self._fd)
        for sink in self.sinks:
            sink.close()


# Printed once before the first step: what the progress line's numbers mean.
LEGEND = (
    "progress: loss = the drafter's training loss; held-out accept = acceptance length against the target's "
    "own greedy tokens on sequences never trained on, the tokens a verify step would accept per draft block "
    "(1 = only the target's own token; higher is better, at most block_size); train accept = the same on the "
    "training batch, against its labels"
)


class Progress:
    """Live progress on the first drafter rank: a rich bar on a terminal, plain lines otherwise.

    The bar starts at the first step, not before: other ranks print their "ready" lines while this one
    warms up, and a live bar started earlier would draw over them.
    """

    def __init__(
        self, total_steps: int, start_step: int, log_every: int, stream: TextIO | None = None
    ) -> None:
        self.total, self.start, self.log_every = total_steps, start_step, log_every
        self.stream = stream or sys.stdout
        self.began = time.monotonic()
        self.heldout: float | None = None  # the latest held-out acceptance length (vs the target)
        self._bar: Any = None
        self._live = self.stream.isatty()
        self._started = False
        # tok/s on the progress line: tokens / seconds over the steps since the line before (never a rate of
        # one step, never a mean of rates)
        self._tokens = self._seconds = 0.0

    def _start(self) -> None:
        self._started = True
        print(LEGEND, file=self.stream, flush=True)
        if not self._live:
            return
        from rich.progress import BarColumn, TextColumn, TimeRemainingColumn
        from rich.progress import Progress as RichProgress

        self._bar = RichProgress(
            TextColumn("[bold]step {task.completed}/{task.total}"),
            BarColumn(),
            TextColumn("{task.fields[status]}"),
            TimeRemainingColumn(),
        )
        self._task = self._bar.add_task("train", total=self.total, completed=self.start, status="")
        self._bar.start()

    def eta_s(self, step: int) -> float:
        done = step - self.start
        return (time.monotonic() - self.began) / done * (self.total - step) if done > 0 else float("nan")

    def update(self, m: StepMetrics) -> None:
        if not self._started:
            self._start()
        if m.heldout_accept_len is not None:
            self.heldout = m.heldout_accept_len
        shown = f"held-out accept {self.heldout:.2f} (target)  " if self.heldout is not None else ""
        self._tokens += m.tokens
        self._seconds += m.step_time_s
        rate = self._tokens / self._seconds if self._seconds > 0 else m.tok_s
        status = f"loss {m.loss:.4f}  {shown}train accept {m.accept_len:.2f}  {rate:,.0f} tok/s"
        printed = m.step % self.log_every == 0 or m.step in (self.total, self.start + 1)
        printed = printed or m.heldout_accept_len is not None
        if self._bar is not None:
            self._bar.update(self._task, completed=m.step, status=status)
        elif printed:
            print(
                f"step {m.step}/{self.total}  {status}  eta {self.eta_s(m.step):.0f}s",
                file=self.stream,
                flush=True,
            )
        if printed:  # the next line's rate counts the steps after this one
            self._tokens = self._seconds = 0.0

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def write_summary(output_dir: Path, summary: dict[str, Any]) -> Path | None:
    """`<output>/summary.json`, atomically: the launcher reads it when the run ends. A full disk is NoSpace,
    except for the summary of a run that already failed: the error that ended it is the one to report, so
    this one is a line on stderr."""
    path = summary_path(output_dir)
    try:
        with writing(path):
            return write_json_atomic(path, summary)
    except NoSpace as exc:
        if summary.get("status") == "ok":
            raise
        print(f"dflash trainer: {SUMMARY_FILE} not written: {exc.message}", file=sys.stderr, flush=True)
        return None


def steady_throughput(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Tokens / seconds over the run's whole pipelined steps, and which steps were used and left out
    (`trainer.run.steady`)."""
    return steady_window(records)


def summarize(records: list[dict[str, Any]], status: str, wall_s: float, **extra: Any) -> dict[str, Any]:
    """The summary of a run from its metric lines."""
    first, last = (records[0], records[-1]) if records else ({}, {})
    evals = [r for r in records if r.get("heldout_accept_len") is not None]
    step_s = sum(r["step_time_s"] for r in records)
    return {
        "status": status,
        "steps": last.get("step", 0),
        "heldout_accept_len": evals[-1]["heldout_accept_len"] if evals else None,
        "heldout_accept_len_labels": evals[-1]["heldout_accept_len_labels"] if evals else None,
        "heldout_accept_len_last_answer": evals[-1].get("heldout_accept_len_last_answer") if evals else None,
        "heldout_evals": len(evals),
        "heldout_sequences": evals[-1].get("heldout_sequences") if evals else 0,
        "heldout_share_of_time": (
            sum(r["heldout_s"] for r in evals) / (step_s + sum(r["heldout_s"] for r in evals))
            if evals
            else None
        ),
        "first_loss": first.get("loss"),
        "final_loss": last.get("loss"),
        "final_accuracy": last.get("accuracy"),
        "final_accept_len": last.get("accept_len"),  # on the training batch: a secondary figure
        **steady_throughput(records),
        "step_drift": step_drift(records),
        "wall_s": wall_s,
        **extra,
    }
