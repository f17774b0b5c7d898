"""Which sequences a source made itself: a spy on one of its methods, shared by the kept-sequence and prefetch tests."""

from __future__ import annotations

import pytest

from trainer.data.sources import TokenizedSource


def calls_to(source: TokenizedSource, method: str, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sequence ids `source.<method>(j)` is called with from now on, in order (the method still runs)."""
    seen: list[int] = []
    original = getattr(source, method)

    def counted(j: int) -> tuple[list[int], list[bool]]:
        seen.append(j)
        return original(j)

    monkeypatch.setattr(source, method, counted)
    return seen
