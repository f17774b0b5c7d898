"""One help style for every command: a flag shows no `<bool>` metavar, an option that takes a value shows its
type (issue 18)."""

from __future__ import annotations

import pytest

from dflash_doctor.cli import run


def test_flags_show_no_bool_metavar_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["runs", "--help"], ["check", "--help"], ["train", "--help"]):
        assert run(command) == 0
        json_line = next(line for line in capsys.readouterr().out.splitlines() if "--json" in line)
        assert "<bool>" not in json_line, command


@pytest.mark.parametrize(
    "command",
    [[], ["check"], ["cache", "restore"], ["cache", "prune"], ["cache", "warm"], ["cache", "status"],
     ["data", "regenerate"], ["data", "preview"], ["train"], ["eval"], ["serve-check"], ["runs", "show"]],
)  # fmt: skip
def test_one_help_style_no_flag_shows_a_type(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """`--help`, `--force`, `--dry-run`, `--no-snapshot`, `--json` alike: a flag shows no `<bool>`; an option
    that takes a value still shows its type."""
    assert run([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "<bool>" not in out, [line for line in out.splitlines() if "<bool>" in line]
    assert "--help" in out
    if command == ["cache", "warm"]:
        assert "<int>" in next(line for line in out.splitlines() if "--heads" in line)


def test_help_paragraphs_are_reflowed_not_hard_wrapped(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 58: a docstring's hard line breaks after its first paragraph reached the help as they were ("Exit 1
    when the" / "probe could not run"); each paragraph is one line to wrap at the terminal's width."""
    monkeypatch.setenv("COLUMNS", "300")
    assert run(["probe", "--help"]) == 0
    out = capsys.readouterr().out
    assert "Exit 1 when the probe could not run or `import torch` failed in it." in out


def test_data_regenerate_help_says_it_samples_too(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 58: it said "(greedy)" only, since sampling came (`--temperature`, `--samples-per-prompt`)."""
    assert run(["data", "regenerate", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--temperature T samples" in out
