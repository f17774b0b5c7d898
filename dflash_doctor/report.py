"""Render check results: a `flutter doctor`-style table for people, versioned JSON for programs.

Also the one place that decides the exit code of an audit: 0 healthy (warnings allowed),
1 any fail (with --strict, any warning too). rich is imported only by the functions that draw
(`render`, `summary_line`), so `check --json` does not pay for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from dflash_doctor import __version__
from dflash_doctor.findings import Finding, Severity, worst
from dflash_doctor.registry import CheckRun

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

REPORT_SCHEMA = "dflash-doctor/report/v1"

ICONS = {
    Severity.OK: ("✓", "green"),
    Severity.SKIP: ("-", "dim"),
    Severity.WARN: ("!", "yellow"),
    Severity.FAIL: ("✗", "red"),
}


def flatten(runs: Iterable[CheckRun]) -> list[Finding]:
    return [f for run in runs for f in run.findings]


def exit_code(findings: Iterable[Finding], strict: bool = False) -> int:
    severities = {f.severity for f in findings}
    if Severity.FAIL in severities or (strict and Severity.WARN in severities):
        return 1
    return 0


def counts(findings: Iterable[Finding]) -> dict[str, int]:
    tally = {s.value: 0 for s in Severity}
    for f in findings:
        tally[f.severity.value] += 1
    return tally


def to_json(runs: list[CheckRun], context: dict[str, Any], strict: bool = False) -> dict[str, Any]:
    findings = flatten(runs)
    return {
        "schema": REPORT_SCHEMA,
        "tool": {"name": "dflash-doctor", "version": __version__},
        "context": context,
        "checks": [{"id": r.check.id, "title": r.check.title, "seconds": round(r.seconds, 4)} for r in runs],
        "findings": [f.to_json() for f in findings],
        "summary": counts(findings),
        "exit_code": exit_code(findings, strict),
    }


def terminal_safe(text: str) -> str:
    """`text` with control characters (escape sequences, carriage returns) written as \\xNN, newlines kept:
    a finding's summary, evidence or remedy names paths, and a path with escape bytes in it printed raw could
    recolour or rewrite the terminal (issue 58, E1: `cache status` printed a cache path's escape bytes raw)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == "\n" else ascii(c)[1:-1] for c in text)


def _format_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return (
            ", ".join(_format_value(v) for v in value)
            if len(value) <= 4
            else ("\n      " + "\n      ".join(_format_value(v) for v in value))
        )
    if isinstance(value, dict):
        return ", ".join(f"{k}={_format_value(v)}" for k, v in value.items())
    return terminal_safe(str(value))


def _verdict_cell(finding: Finding, verbose: bool) -> Text:
    from rich.text import Text

    text = Text(terminal_safe(finding.summary))
    if _shows_details(finding, verbose):
        for key, value in finding.evidence.items():
            text.append(f"\n  {terminal_safe(str(key))}: {_format_value(value)}", style="dim")
    return text


def _shows_details(finding: Finding, verbose: bool) -> bool:
    return verbose or finding.severity in (Severity.WARN, Severity.FAIL)


def remedy_lines(remedy: str) -> list[tuple[str, str]]:
    """(text, style) lines for a remedy, each printed whole (never wrapped, so it pastes as it reads).

    One command: one `fix:` line. A command followed by `  # why`: the command alone on the `fix:`
    line and the comment on the next, so nothing that must run hides after a `#` on the same line.
    Several lines: a fenced block, one command per line.
    """
    commands = [terminal_safe(line) for line in remedy.strip().splitlines() if line.strip()]
    if len(commands) > 1:
        return [("fix:", "bold cyan"), ("```", "dim"), *((c, "cyan") for c in commands), ("```", "dim")]
    command, hash_sign, comment = commands[0].partition("  # ") if commands else ("", "", "")
    lines = [(f"fix: {command.rstrip()}", "cyan")]
    if hash_sign:
        lines.append((f"     # {comment.strip()}", "dim"))
    return lines


def render(runs: list[CheckRun], console: Console, verbose: bool = False, header: str | None = None) -> None:
    """Print the findings grouped by area, then the summary line.

    Findings sit in a table (the verdict column folds long evidence); a remedy is printed between table
    segments on lines of its own with soft wrap, so a terminal of any width or a pipe never breaks it.
    """
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    areas: dict[str, list[CheckRun]] = {}
    for run in runs:
        areas.setdefault(run.check.area, []).append(run)
    all_findings = flatten(runs)
    id_width = max([len(f.id) for f in all_findings] + [len(a) for a in areas] + [8])
    indent = " " * (3 + 1 + id_width + 1 + 2)  # under the verdict column, past its two-space indent

    def new_table() -> Table:
        table = Table(show_header=False, box=None, pad_edge=False, expand=False)
        table.add_column("", width=3, no_wrap=True)
        table.add_column("finding", width=id_width, no_wrap=True)
        table.add_column("verdict", overflow="fold")
        return table

    if header:
        console.print(escape(header), soft_wrap=True)
    table = new_table()
    for area, area_runs in areas.items():
        findings = flatten(area_runs)
        icon, style = ICONS[worst(findings)]
        titles = ", ".join(dict.fromkeys(r.check.title for r in area_runs))
        table.add_row(
            Text(f"[{icon}]", style=f"bold {style}"), Text(area, style="bold"), Text(titles, style="bold")
        )
        for finding in findings:
            f_icon, f_style = ICONS[finding.severity]
            table.add_row(
                Text(f" {f_icon}", style=f_style),
                Text(finding.id, style="dim" if finding.severity == Severity.OK else f_style),
                _verdict_cell(finding, verbose),
            )
            if finding.remedy and _shows_details(finding, verbose):
                console.print(table)
                table = new_table()
                for line, line_style in remedy_lines(finding.remedy):
                    console.print(Text(indent + line, style=line_style), soft_wrap=True)
    if table.row_count:
        console.print(table)
    console.print(summary_line(runs), soft_wrap=True)


def summary_line(runs: list[CheckRun]) -> Text:
    from rich.text import Text

    findings = flatten(runs)
    tally = counts(findings)
    bad_areas = sorted({f.area for f in findings if f.severity in (Severity.WARN, Severity.FAIL)})
    if not bad_areas:
        return Text(f"• No issues found ({tally['ok']} ok, {tally['skip']} skipped).", style="bold green")
    style = "bold red" if tally["fail"] else "bold yellow"
    noun = "area" if len(bad_areas) == 1 else "areas"
    return Text(
        f"! Doctor found issues in {len(bad_areas)} {noun} ({', '.join(bad_areas)}): "
        f"{tally['fail']} failing, {tally['warn']} warning, {tally['ok']} ok, {tally['skip']} skipped.",
        style=style,
    )


def dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=False, default=str)
