"""`cache warm --device` that the warm-up cannot compile for is refused before the child starts (issue 29)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_doctor.cli import run


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("DFLASH_DOCTOR_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_cache_warm_on_a_device_it_cannot_compile_for_is_refused_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: rejected by the child, after 8 s."""
    from dflash_doctor.commands import cache as cache_command

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the warm-up child was started")

    monkeypatch.setattr(cache_command, "run_warm_child", started)
    monkeypatch.setattr(cache_command, "_current", started)
    assert run(["cache", "warm", "--device", "tpu"]) == 2
    assert "--device 'tpu': the warm-up compiles for cpu, cuda or cuda:N" in capsys.readouterr().err
