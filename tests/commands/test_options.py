"""The options every config-reading command shares (commands/options.py): one `--config`, one `--set`."""

from __future__ import annotations

import pytest

from dflash_doctor.cli import run


def test_a_repeated_set_key_is_said_with_both_values_and_the_last_one_used(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The last one won without a word; now one warning line names both values (the run goes on)."""
    args = ["train", "--dry-run", "--config", "tiny-cpu", "--no-deep", "--json"]
    assert run([*args, "--set", "optim.steps=50", "--set", "optim.steps = 80"]) in (0, 1)
    captured = capsys.readouterr()
    assert "warning: --set optim.steps given twice ('50', then '80'): '80' is used" in captured.err
    assert "optim.steps = 80" in captured.out  # the last one, passed on to the workers


def test_distinct_set_keys_pass_through(capsys: pytest.CaptureFixture[str]) -> None:
    from dflash_doctor.commands.options import one_value_per_key

    assert one_value_per_key(["a.b=1", "a.c=2", "a.b = 1"]) == ["a.b=1", "a.c=2", "a.b = 1"]
    assert one_value_per_key(None) is None
    assert capsys.readouterr().err == ""  # the same value twice: nothing to say
