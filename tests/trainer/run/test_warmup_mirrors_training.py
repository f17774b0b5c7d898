"""The warm-up builds what training builds: the same target (the same arguments to the one loader), so the
graphs it compiles are the ones the first real step runs. If the two ever diverge (say `keep_head` or
`inference_tensors` on one side only), the first step compiles cold: this test names the difference."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from trainer.run import train, warmup
from trainer.runspec.config import load_config
from trainer.target_model import capture


class Built(Exception):
    """Raised by the recording loader: the build stops once its arguments are known."""


def _recorded(monkeypatch: pytest.MonkeyPatch, build: Any) -> dict[str, Any]:
    calls: list[dict[str, Any]] = []

    def record(*args: Any, **kwargs: Any) -> None:
        calls.append({"args": args, **kwargs})
        raise Built

    monkeypatch.setattr(capture, "load_capture_target", record)
    with pytest.raises(Built):
        build()
    assert len(calls) == 1
    return calls[0]


@pytest.mark.parametrize("eval_fraction", [0.0, 0.1])
def test_the_colocated_warm_up_loads_the_target_exactly_as_training_does(
    monkeypatch: pytest.MonkeyPatch, eval_fraction: float
) -> None:
    cfg = load_config(
        "tiny-cpu", [f"data.eval_fraction={eval_fraction}", 'topology.mode="colocated"', "topology.ranks=1"]
    )
    cuda = torch.device("cuda", 0)  # never touched: the loader stops before any tensor exists
    split = SimpleNamespace(eval_batches=1 if eval_fraction else 0)
    run = SimpleNamespace(cfg=cfg, device=cuda, split=split)
    trained = _recorded(monkeypatch, lambda: train.build_target(run, colocated=True))  # type: ignore[arg-type]
    warmed = _recorded(monkeypatch, lambda: warmup.warm_up_colocated_target(cfg, cuda))
    assert warmed == trained
    assert trained["keep_head"] is bool(eval_fraction) and trained["inference_tensors"] is False
