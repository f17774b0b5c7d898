"""What a `check` process imports: its wall time is mostly start-up (issue 40: <= 0.5 s warm).

Run in a child interpreter, so that nothing this test session imported counts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dflash_doctor.env import forked, size_survey

ROOT = Path(__file__).resolve().parents[1]

# Heavy for a static audit: torch and transformers take seconds; pydantic (typer >= 0.29) a tenth of one.
HEAVY = ("torch", "transformers", "pydantic", "numpy", "triton", "safetensors")

PROBE = f"""
import json, sys
from dflash_doctor.cli import run
code = run(["check", "--no-lock", "--json"])
print("MODULES " + json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)), file=sys.stderr)
"""


def check_in_a_child(tmp_path: Path) -> tuple[list[str], dict[str, Any]]:
    """(the heavy modules a `check` process imported, its JSON report)."""
    environ = dict(os.environ, DFLASH_DOCTOR_HOME=str(tmp_path / "home"))
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith("MODULES ")]
    assert lines, f"the probe printed no module list (exit {done.returncode}): {done.stderr[-2000:]}"
    return json.loads(lines[-1].removeprefix("MODULES ")), json.loads(done.stdout)


def imported_by_check(tmp_path: Path) -> list[str]:
    return check_in_a_child(tmp_path)[0]


def test_check_imports_nothing_heavy_and_stats_in_processes(tmp_path: Path) -> None:
    """Nothing heavy imported; and no thread runs when the checks start, so the RECORD files' stat forks, beside
    the other checks, as many processes as this machine and this environment's size allow (a stray thread makes
    it no child at all: the stat then runs in the checks' own process)."""
    heavy, report = check_in_a_child(tmp_path)
    assert heavy == []
    clobbered = next(f for f in report["findings"] if f["id"] == "ownership.clobbered")
    files = clobbered["evidence"]["files_checked"]
    assert files >= size_survey.PATHS_PER_PROCESS  # enough for a child: this test's environment is torch's
    allowed = min(size_survey.MAX_PROCESSES, forked.usable_cpus(), files // size_survey.PATHS_PER_PROCESS)
    assert clobbered["evidence"]["stat_beside_checks"] is True
    assert clobbered["evidence"]["processes"] == max(1, allowed)
    # what starting the work cost the checks' process, by starter: no check's own figure includes it
    assert {"ownership.survey", "cache.walks"} <= set(report["context"]["start_seconds"])
    assert all(seconds >= 0 for seconds in report["context"]["start_seconds"].values())
    assert set(report["context"]["phase_seconds"]) == {"environment", "save"}


def test_the_probe_sees_a_heavy_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe itself can fail: a module imported on start-up (here numpy, through a sitecustomize) is seen."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import numpy\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    assert imported_by_check(tmp_path) == ["numpy"]
