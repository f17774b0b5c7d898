#!/usr/bin/env bash
# Issue 40 §2's `check` row on one H200 (~1 min): first and warm (bench/check/check_speed.py, with where the time
# inside `check` went), then the RECORD audit's survey in 1, 2, 4 and 8 processes and threads (bench/check/stat_survey.py,
# which decides size_survey.MAX_PROCESSES). S17 read 0.52 s warm (best of 9); S18 0.95 s on another machine.
#   run(kind="nvidia-h200", carry=[".whl"], timeout_s=120, command="bash bench/suites/check_h200.sh")
# Results: $OUT/results-check_h200.json. CPU dry run (nothing installed):
#   SUITE_TINY=1 OUT=/tmp/x PATH=.venv/bin:$PATH bash bench/suites/check_h200.sh
set -u
cd "$(dirname "$0")/../.."
SUITE_BUDGET_S=${SUITE_BUDGET_S:-110}
source bench/lib/suite_lib.sh
stage setup 25 bash -c install_carried_wheels
stage check_first_warm 50 python3 bench/check/check_speed.py --rounds 3 --warm 6 --json "$RES/check_speed_40.json"
stage stat_survey 25 python3 bench/check/stat_survey.py --threads --json "$RES/stat_survey.json"
finish check_h200
