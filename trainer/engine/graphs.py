"""A decode step captured once as a CUDA graph and replayed: a 30-layer step of a 135M target is ~450 small
kernels, and launched one by one they cost more than the step's arithmetic.

Capturing runs the step twice (once on a side stream to warm the allocator and compile Triton kernels, once under
capture), and each run changes the job's state on the device. `StepGraphs` saves that state before and puts it
back after, so capturing a step changes nothing a later replay or the host will read.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch


class StepGraphs:
    """One captured graph per key (e.g. the attended length on the SDPA path), all in one memory pool."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._graphs: dict[Hashable, Any] = {}
        self._pool: Any = None

    def __len__(self) -> int:
        return len(self._graphs)

    def clear(self) -> None:
        self._graphs.clear()

    def replay(self, key: Hashable, step: Callable[[], None], state: Sequence[torch.Tensor]) -> None:
        """Run `step` as its captured graph, capturing it first (with `state` saved and put back)."""
        if key not in self._graphs:
            self._graphs[key] = self._capture(step, state)
        self._graphs[key].replay()

    def _capture(self, step: Callable[[], None], state: Sequence[torch.Tensor]) -> Any:
        saved = [t.clone() for t in state]
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            step()
        for tensor, before in zip(state, saved, strict=True):
            tensor.copy_(before)
        return graph
