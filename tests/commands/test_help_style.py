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
