#!/usr/bin/env bash
# Issue 40 §2's `check` row on one H200 (~2 min): first and warm (bench/check/check_speed.py, with where the time
# inside `check` went, start-up and phases included, and how much work the slow checks had; warm_plain: as the
# README runs it, without --json), this checkout against the code carried in .carry-check-before (after, before,
# after, so the machine's drift reaches both), then the RECORD audit's survey in 1, 2, 4 and 8 processes beside 2,
# 4 and 8 threads (bench/check/stat_survey.py, which decides size_survey.MAX_PROCESSES), then what forking costs
# the checks' own process (bench/check/fork_cost.py). Warm median: S21's first call (S19's code as before)
# 0.42 / 0.59 s after, 0.83 s before.
#   run(kind="nvidia-h200", carry=[".whl", ".carry-check-before"], timeout_s=200, command="bash bench/suites/check_h200.sh")
# .carry-check-before/before.tar.gz, the code before (S21: the session's start, eb35f63; the device gets no .git):
#   mkdir -p .carry-check-before && git archive --format=tar.gz -o .carry-check-before/before.tar.gz eb35f63 -- \
#       dflash_doctor checks dflash_base trainer pyproject.toml
# Results: $OUT/results-check_h200.json. CPU dry run (nothing installed):
#   SUITE_TINY=1 OUT=/tmp/x PATH=.venv/bin:$PATH bash bench/suites/check_h200.sh
set -u
cd "$(dirname "$0")/../.."
SUITE_BUDGET_S=${SUITE_BUDGET_S:-160}
source bench/lib/suite_lib.sh
# The image's python may run with PYTHONDONTWRITEBYTECODE set, and this checkout comes without bytecode: compile it
# first, as `pip install` does, so that every run measures what an installed dflash-doctor costs (S21: without it,
# each run compiled every module again: +60 ms a run on a 2-core box).
env | grep '^PYTHON' || true
stage setup 25 bash -c "install_carried_wheels && python3 -m compileall -q dflash_doctor checks dflash_base trainer >/dev/null && echo compiled"
speed=(python3 -m bench.check.check_speed --rounds 3 --warm 6 --plain 2)
if [ -f .carry-check-before/before.tar.gz ]; then
    rm -rf /tmp/check-before && mkdir -p /tmp/check-before &&
        tar -xzf .carry-check-before/before.tar.gz -C /tmp/check-before &&
        python3 -m compileall -q /tmp/check-before >/dev/null
    stage check_after_1 40 "${speed[@]}" --json "$RES/check_speed_40.json"
    stage check_before 40 "${speed[@]}" --repo /tmp/check-before --json "$RES/check_speed_40_before.json"
    stage check_after_2 40 "${speed[@]}" --json "$RES/check_speed_40_again.json"
else
    stage check_first_warm 50 "${speed[@]}" --json "$RES/check_speed_40.json"
fi
stage stat_survey 25 python3 -m bench.check.stat_survey --threads --json "$RES/stat_survey.json"
stage fork_cost 40 python3 -m bench.check.fork_cost --rounds 6 --json "$RES/fork_cost.json"
# The image ships its site-packages without bytecode and sets PYTHONDONTWRITEBYTECODE (S21): every `check` compiles
# typer, click, rich and packaging from source again. `pip install dflash-doctor` would have compiled them. Say how
# many of their modules have bytecode, compile them as pip would, and time `check` once more.
DEPS=$(python3 -c "import os, typer, rich, packaging, platformdirs; print(' '.join(os.path.dirname(m.__file__) for m in (typer, rich, packaging, platformdirs)))")
for d in $DEPS; do echo "$d: $(find "$d" -name '*.py' | wc -l) modules, $(find "$d" -name '*.pyc' | wc -l) cached"; done
stage deps_compiled 40 bash -c "python3 -m compileall -q $DEPS >/dev/null; ${speed[*]} --json $RES/check_speed_deps_compiled.json"
finish check_h200
