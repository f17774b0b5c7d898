"""trainer.run.pipeline: the colocated capture queued ahead keeps the batch order; a step's numbers read late
are the numbers of that step."""

from __future__ import annotations

import pytest
import torch

from trainer.model.batch import CapturedBatch
from trainer.run.pipeline import CaptureAhead, StepTimer
from trainer.run.step_numbers import StepNumbers


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


def test_overlap_capture_is_auto_by_default_and_step_on_cuda_only() -> None:
    """`auto` (the default) captures on a second stream on CUDA ("step": measured faster at b16 on an H200,
    the same losses) and synchronously on a CPU, whatever is set."""
    from dflash_base.errors import ConfigError
    from trainer.runspec.config import load_config
    from trainer.runspec.topology import overlap_mode

    assert load_config("tiny-cpu").topology.overlap_capture == "auto"
    assert (overlap_mode("auto", on_cuda=True), overlap_mode("auto", on_cuda=False)) == ("step", "off")
    assert overlap_mode("optimizer", on_cuda=False) == "off" and overlap_mode("off", on_cuda=True) == "off"
    for mode in ("off", "step", "optimizer"):
        assert (
            load_config("tiny-cpu", [f'topology.overlap_capture="{mode}"']).topology.overlap_capture == mode
        )
    with pytest.raises(
        ConfigError, match=r'topology\.overlap_capture: must be one of "auto", "off", "step", "optimizer"'
    ):
        load_config("tiny-cpu", ["topology.overlap_capture=true"])


@pytest.mark.gpu
def test_a_batch_captured_on_a_second_stream_is_complete_when_training_reads_it() -> None:
    """CUDA: the capture stream is held up (a spin kernel) before it writes the batch; the training stream
    must still read the finished values, because next_batch makes it wait for the capture's event."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    device = torch.device("cuda", 0)

    def slow_capture(micro_step: int) -> CapturedBatch:
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time on the current (capture) stream
        ids = torch.full((1, 4), micro_step, device=device)
        hidden = torch.full((1, 4, 2), float(micro_step), device=device) * 2
        return CapturedBatch(ids, torch.ones(1, 4, dtype=torch.bool, device=device), hidden, micro_step)

    ahead = CaptureAhead(slow_capture, total_micro_steps=3, stream=torch.cuda.Stream(device))
    for m in (1, 2):
        ahead.prefetch(m)
        batch = ahead.next_batch(m)
        assert float(batch.hidden.sum()) == 2.0 * m * 8  # read on the training stream
        assert int(batch.input_ids.sum()) == 4 * m


@pytest.mark.gpu
def test_an_optimizer_gated_capture_starts_after_the_update_begins() -> None:
    """CUDA: the training stream is held up (a spin kernel) before its optimizer step; a capture gated by
    OptimizerStart must begin on the GPU after that step's start, not while the spin still runs."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from trainer.run.pipeline import OptimizerStart

    device = torch.device("cuda", 0)
    weight = torch.nn.Parameter(torch.ones(4, device=device))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    start_at = OptimizerStart(optimizer)
    started: list[torch.cuda.Event] = []

    def capture(micro_step: int) -> CapturedBatch:
        began = torch.cuda.Event(enable_timing=True)
        began.record()  # on the capture stream: when the capture's first kernel may run
        started.append(began)
        ids = torch.full((1, 4), micro_step, device=device)
        return CapturedBatch(ids, torch.ones(1, 4, dtype=torch.bool, device=device), ids[..., None].float())

    ahead = CaptureAhead(capture, total_micro_steps=2, stream=torch.cuda.Stream(device), start_at=start_at)
    weight.grad = torch.ones_like(weight)
    torch.cuda._sleep(200_000_000)  # ~0.1 s on the training stream before the update
    optimizer.step()  # the pre-hook records the update's start
    ahead.prefetch(1)
    batch = ahead.next_batch(1)
    torch.cuda.synchronize()
    assert start_at.event is not None and started
    assert start_at.event.elapsed_time(started[0]) >= 0.0  # ms from the update's start to the capture's
    assert int(batch.input_ids.sum()) == 4
