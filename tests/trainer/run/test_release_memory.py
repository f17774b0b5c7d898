"""Worker ranks hand the build's transient GPU blocks back before training (and do nothing on CPU)."""

from __future__ import annotations

import pytest
import torch

from trainer.run.train import release_cached_memory


@pytest.mark.parametrize(("device", "calls"), [("cuda:1", 1), ("cpu", 0)])
def test_cached_blocks_are_released_on_cuda_only(
    monkeypatch: pytest.MonkeyPatch, device: str, calls: int
) -> None:
    seen: list[None] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: seen.append(None))
    release_cached_memory(torch.device(device))
    assert len(seen) == calls
