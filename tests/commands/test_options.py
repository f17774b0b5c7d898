"""The options every config-reading command shares (commands/options.py): one `--config`, one `--set`."""

from __future__ import annotations

import pytest

from dflash_doctor.cli import run


@pytest.mark.parametrize(
    "command",
    [["train", "--dry-run"], ["data", "preview"], ["eval", "--drafter", "ngram"], ["data", "regenerate"]],
)
def test_a_repeated_set_key_is_refused_naming_both_values(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The last one won without a word; now exit 2 before any config is read."""
    args = [*command, "--config", "tiny-cpu", "--set", "optim.steps=50", "--set", "optim.steps = 80"]
    if command[-1] == "regenerate":
        args += ["--prompts", "p.jsonl", "--out", "o.jsonl"]
    assert run(args) == 2
    err = " ".join(capsys.readouterr().err.replace("│", " ").split())  # typer's usage box, unwrapped
    assert "optim.steps is set twice ('50', then '80'): give it once" in err, err


def test_distinct_set_keys_pass_through() -> None:
    from dflash_doctor.commands.options import one_value_per_key

    assert one_value_per_key(["a.b=1", "a.c=2"]) == ["a.b=1", "a.c=2"]
    assert one_value_per_key(None) is None
