"""bench/launch/time_to_first_step.py's own logic: a launch whose `--json` document is larger than a pipe holds
(127 kB on the H200) still ends, and a launch that ends 3 comes back with its traceback."""

from __future__ import annotations

import sys
from pathlib import Path

from bench.launch.time_to_first_step import STDERR_TAIL_CHARS, launch_environ, run_launch

# A stand-in launcher: a metrics line, then the JSON document (`size` bytes of notes), stderr, the exit code.
LAUNCHER = """
import json, sys, time
out, size, code = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
open(out + "/metrics.jsonl", "w").write('{"step": 1}\\n')
time.sleep(0.5)  # the bench polls every 50 ms
run = {"status": "succeeded", "notes": ["x" * size], "timeline": {"phases": [{"phase": "gate", "seconds": 1.5}]}}
sys.stderr.write("noise\\n" * 2000 + "Traceback (most recent call last):\\nValueError: a bug\\n")
print(json.dumps({"schema": "dflash-doctor/train/v1", "status": "succeeded", "run": run}))
sys.exit(code)
"""


def launch_stand_in(tmp_path: Path, size: int, code: int) -> dict:
    out = tmp_path / "out-cold"
    out.mkdir()
    command = [sys.executable, "-c", LAUNCHER, str(out), str(size), str(code)]
    return run_launch(command, tmp_path, launch_environ(tmp_path, tmp_path / "home"), out)


def test_a_json_document_larger_than_a_pipe_holds_does_not_stop_the_launch(tmp_path: Path) -> None:
    row = launch_stand_in(tmp_path, 200_000, 0)
    assert row["exit"] == 0 and row["status"] == "succeeded"
    assert row["phases"] == {"gate": 1.5} and row["first_step_s"] is not None
    assert "stderr_tail" not in row
    assert (tmp_path / "out-cold.stdout.json").stat().st_size > 200_000  # kept beside the output


def test_a_launch_that_ends_3_brings_back_its_traceback(tmp_path: Path) -> None:
    row = launch_stand_in(tmp_path, 10, 3)
    assert row["exit"] == 3
    assert len(row["stderr_tail"]) == STDERR_TAIL_CHARS == 6000
    assert row["stderr_tail"].endswith("Traceback (most recent call last):\nValueError: a bug\n")
    assert Path(row["stderr"]).read_text().startswith("noise")


def test_the_launch_prints_its_traceback_and_keeps_the_callers_path(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")
    environ = launch_environ(tmp_path / "repo", tmp_path / "home")
    assert environ["DFLASH_DOCTOR_DEBUG"] == "1"  # dflash_doctor/cli.py: exit 3 prints the traceback
    assert environ["PYTHONPATH"] == f"{tmp_path / 'repo'}:/tmp/site"
    assert environ["DFLASH_DOCTOR_HOME"] == str(tmp_path / "home")
    assert "TORCHINDUCTOR_CACHE_DIR" not in environ


def test_the_warm_up_comparison_prints_each_launchs_ratio_and_the_phases_beside_the_rank() -> None:
    from bench.launch.time_to_first_step import ratios, table

    def row(first: float | None, beside: dict[str, float]) -> dict:
        return {"exit": 0, "first_step_s": first, "phases": {"compile": 1.0}, "beside": beside}

    rows = {
        "cold (separate)": row(100.0, {}),
        "cold (lone)": row(80.0, {"gate": 3.0}),
        "warm (separate)": row(50.0, {}),
        "warm (lone)": row(None, {"gate": 1.0}),
    }
    assert ratios(rows, ("cold", "warm")).splitlines() == [
        "cold: lone rank 80.0 s / separate warm-up 100.0 s = 0.80x",
        "warm: no first step in one of the two (see the rows' exit and stderr)",
    ]
    printed = table(rows).splitlines()
    assert (
        "(gate, beside)" in printed[0] and printed[2].split()[-1] == "3.00" and printed[1].split()[-1] == "-"
    )


def test_several_rounds_give_each_rounds_ratio_and_their_median() -> None:
    from bench.launch.time_to_first_step import ratios

    rows = {
        f"cold ({arm}, round {r})": {"first_step_s": first}
        for r, (separate, lone) in enumerate([(100.0, 50.0), (100.0, 70.0), (80.0, 80.0)], start=1)
        for arm, first in (("separate", separate), ("lone", lone))
    }
    lines = ratios(rows, ("cold",), rounds=3).splitlines()
    assert lines[1] == "cold, round 2: lone rank 70.0 s / separate warm-up 100.0 s = 0.70x"
    assert lines[-1] == "cold: median 0.70x over 3 rounds"
