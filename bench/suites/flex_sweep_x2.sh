#!/usr/bin/env bash
# flex_attention kernel options at both recipes' shapes, one recipe per H200, in parallel (issue 7):
#   cuda:0  seed-b32 (the story's shapes: flex is > 50% of the drafter step)
#   cuda:1  qwen3-8b-b16
#   run(kind="nvidia-h200-x2", carry=[".whl"], timeout_s=600, command="bash bench/suites/flex_sweep_x2.sh")
# CPU dry run of the plumbing: SUITE_TINY=1 OUT=/tmp/x PATH=.venv/bin:$PATH bash bench/suites/flex_sweep_x2.sh
set -u
cd "$(dirname "$0")/../.."
SUITE_BUDGET_S=${SUITE_BUDGET_S:-560}
source bench/lib/suite_lib.sh
stage setup 25 bash -c install_carried_wheels
SWEEP_S=$(( SUITE_BUDGET_S - ($(date +%s) - SUITE_START) - 150 ))  # the last row may compile for minutes
stage sweeps $((SWEEP_S + 140)) bash -c "
    python3 -m bench.kernels.flex_sweep $TINY --config seed-b32 --device cuda:0 --budget-s $SWEEP_S \
        --out '$RES/flex_sweep-seed-b32.json' > '$LOGS/sweep-b32.log' 2>&1 &
    python3 -m bench.kernels.flex_sweep $TINY --config qwen3-8b-b16 --device cuda:1 --budget-s $SWEEP_S \
        --out '$RES/flex_sweep-qwen3-8b-b16.json' > '$LOGS/sweep-b16.log' 2>&1 &
    wait; tail -n 30 '$LOGS/sweep-b32.log' '$LOGS/sweep-b16.log'"
finish flex-sweep
