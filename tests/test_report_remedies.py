"""Remedies paste as printed: a long one is printed whole at any width, a multi-line one is a fenced block
(issue 18)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from dflash_doctor.findings import fail
from dflash_doctor.registry import Check, CheckRun
from dflash_doctor.report import remedy_lines, render

LONG = "export TORCHINDUCTOR_CACHE_DIR=/home/someone/.cache/dflash-doctor/cache/inductor-for-this-team"


def rendered(remedy: str, width: int) -> str:
    finding = fail(
        "cache.volatile", "the compile cache is in a temp folder " * 3, remedy=remedy, path="/tmp/x"
    )
    runs = [CheckRun(Check("cache.volatile", "compile cache", lambda c: []), [finding], 0.0)]
    out = io.StringIO()
    render(runs, Console(file=out, width=width, highlight=False))
    return out.getvalue()


@pytest.mark.parametrize("width", [80, 40])
def test_a_remedy_is_printed_whole_at_any_width(width: int) -> None:
    text = rendered(LONG + "  # a cache only you own", width)
    fix_line = next(line for line in text.splitlines() if "fix:" in line)
    assert fix_line.strip() == f"fix: {LONG}"  # whole, and nothing after it on the same line
    assert "# a cache only you own" in text.split(fix_line)[1].splitlines()[1]


def test_a_multi_line_remedy_is_a_fenced_block() -> None:
    assert remedy_lines("pip uninstall -y a\npip install b") == [
        ("fix:", "bold cyan"),
        ("```", "dim"),
        ("pip uninstall -y a", "cyan"),
        ("pip install b", "cyan"),
        ("```", "dim"),
    ]
