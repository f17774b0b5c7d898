"""trainer.pipeline: the colocated capture queued ahead keeps the batch order; a step's numbers read late
are the numbers of that step."""

from __future__ import annotations

import torch

from trainer.batch import CapturedBatch
from trainer.pipeline import CaptureAhead, StepNumbers, StepTimer


def fake_capture(calls: list[int]):
    def capture(micro_step: int) -> CapturedBatch:
        calls.append(micro_step)
        ids = torch.full((1, 4), micro_step)
        return CapturedBatch(ids, torch.ones(1, 4, dtype=torch.bool), torch.zeros(1, 4, 2), micro_step)

    return capture


def test_prefetched_batches_come_back_in_order_and_each_is_captured_once() -> None:
    calls: list[int] = []
    ahead = CaptureAhead(fake_capture(calls), total_micro_steps=4)
    got = [ahead.next_batch(0).index]
    for m in range(1, 4):
        ahead.prefetch(m)
        ahead.prefetch(m)  # asked twice: captured once
        got.append(ahead.next_batch(m).index)
    assert got == [0, 1, 2, 3]
    assert calls == [0, 1, 2, 3]
    assert not ahead.ready  # nothing left behind


def test_prefetch_past_the_last_micro_step_captures_nothing() -> None:
    calls: list[int] = []
    ahead = CaptureAhead(fake_capture(calls), total_micro_steps=2)
    ahead.prefetch(2)
    assert calls == [] and not ahead.ready


def test_without_prefetch_batches_are_captured_when_asked() -> None:
    calls: list[int] = []
    ahead = CaptureAhead(fake_capture(calls), total_micro_steps=3)
    assert [ahead.next_batch(m).index for m in range(3)] == [0, 1, 2]
    assert calls == [0, 1, 2]


def test_step_numbers_are_a_copy_taken_when_queued() -> None:
    values = torch.tensor([1.0, 2.0, 3.0])
    numbers = StepNumbers(values)
    values.add_(10)  # the next step reuses or changes its tensors: the queued copy must not follow
    assert numbers.read().tolist() == [1.0, 2.0, 3.0]


def test_cpu_timer_measures_host_time_between_marks() -> None:
    timer = StepTimer(torch.device("cpu"))
    start = timer.mark()
    end = timer.mark()
    assert 0.0 <= timer.seconds(start, end) < 1.0
