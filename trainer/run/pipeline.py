"""Keep the GPU fed: queue the next capture early, and read a step's numbers one step late.

A step used to end with host reads (token counts, the grad norm, the loss sums, the step time). Each read
drains the GPU, which then idles while the host logs and launches the next work. On a colocated rank the
capture of the next batch waited behind those reads too: 10% of a qwen3-8b-b16 step on an H200 was the
rank waiting for its own capture. Here:

  - `CaptureAhead` queues the capture of the next step's first batch right behind this step's optimizer
    update (colocated ranks: the batch order does not change, only when its kernels are queued);
  - a step's sums go to the host without blocking and are read once the next step's work is queued, so
    the host waits on nothing the GPU still has to do (`trainer.run.step_numbers`);
  - `StepTimer` times steps with CUDA events (host clock on CPU), so a step's time is the GPU's, from
    the end of the previous step's work to the end of this one's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from trainer.model.batch import CapturedBatch


class OptimizerStart:
    """The training stream's position at the start of each optimizer update: an event recorded by a step
    pre-hook, so a capture on another stream can be held until the update begins."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.event: torch.cuda.Event | None = None
        optimizer.register_step_pre_hook(self._record)

    def _record(self, *_: Any) -> None:
        self.event = torch.cuda.Event(enable_timing=True)  # timed: a test can place captures against it
        self.event.record()


class CaptureAhead:
    """Micro-batch `m` of a colocated rank, captured when asked or earlier by `prefetch(m)`.

    With a `stream` (`topology.overlap_capture`, CUDA), a prefetched capture is queued on that second stream:
    the GPU may run it beside the work already queued on the training stream rather than after it; with
    `start_at`, not before the optimizer update begins (its memory-bound kernels beside the capture's
    matmuls, the backward's matmuls left alone). The training stream waits for the capture's event before
    using the batch, and the batch's tensors are marked as used there, so the caching allocator does not
    hand their memory back to the capture stream while training still reads them. The capture reads only
    the frozen target and its own fresh inputs, so nothing else on the training stream must come first.
    """

    def __init__(
        self,
        capture: Callable[[int], CapturedBatch],
        total_micro_steps: int,
        stream: torch.cuda.Stream | None = None,
        start_at: OptimizerStart | None = None,
    ) -> None:
        self.capture, self.total, self.stream, self.start_at = capture, total_micro_steps, stream, start_at
        self.ready: dict[int, tuple[CapturedBatch, torch.cuda.Event | None]] = {}

    def next_batch(self, micro_step: int) -> CapturedBatch:
        entry = self.ready.pop(micro_step, None)
        if entry is None:
            return self.capture(micro_step)
        batch, done = entry
        if done is not None:
            training = torch.cuda.current_stream()
            training.wait_event(done)
            for tensor in batch.tensors():
                tensor.record_stream(training)
        return batch

    def prefetch(self, micro_step: int) -> None:
        """Queue micro-step `micro_step`'s capture now (a no-op past the last one, or when already queued)."""
        if micro_step >= self.total or micro_step in self.ready:
            return
        if self.stream is None:
            self.ready[micro_step] = (self.capture(micro_step), None)
            return
        if self.start_at is not None and self.start_at.event is not None:
            self.stream.wait_event(self.start_at.event)
        with torch.cuda.stream(self.stream):
            batch = self.capture(micro_step)
            done = torch.cuda.Event()
            done.record(self.stream)
        self.ready[micro_step] = (batch, done)


class StepTimer:
    """Marks on the device's timeline: CUDA events on a GPU, the host clock elsewhere (CPU work is
    synchronous, so the host clock is its timeline)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        """Time between two marks; on CUDA, waits for `end` to have happened."""
        if not self.cuda:
            return float(end - start)
        end.synchronize()
        return float(start.elapsed_time(end)) / 1000.0
