#!/usr/bin/env bash
# The real drafter step with the flex options bench/kernels/flex_sweep.py found, one recipe per H200, in parallel (issue 7):
#   cuda:0  seed-b32: trainer (padded flex context), unpadded kv, flex fwd TMA, flex fwd 64x64
#   cuda:1  qwen3-8b-b16: trainer, flex fwd TMA
#   run(kind="nvidia-h200-x2", carry=[".whl"], timeout_s=600, command="bash bench/suites/variants_x2.sh")
# CPU dry run of the plumbing: SUITE_TINY=1 OUT=/tmp/x PATH=.venv/bin:$PATH bash bench/suites/variants_x2.sh
set -u
cd "$(dirname "$0")/../.."
SUITE_BUDGET_S=${SUITE_BUDGET_S:-560}
source bench/lib/suite_lib.sh
stage setup 25 bash -c install_carried_wheels
RUN_S=$(( SUITE_BUDGET_S - ($(date +%s) - SUITE_START) - 180 ))  # a row started late may compile for a minute
V=(python3 -m bench.kernels.drafter_variants $TINY --budget-s $RUN_S)
stage variants $((RUN_S + 80)) bash -c "
    ${V[*]} --config seed-b32 --device cuda:0 ${SUITE_TINY:+--device cpu} --variant trainer --variant 'unpadded kv' --variant 'flex fwd TMA' \
        --variant 'flex fwd 64x64' --out '$RES/drafter_variants-seed-b32.json' > '$LOGS/variants-b32.log' 2>&1 &
    ${V[*]} --config qwen3-8b-b16 --device cuda:1 ${SUITE_TINY:+--device cpu} --variant trainer --variant 'flex fwd TMA' \
        --out '$RES/drafter_variants-qwen3-8b-b16.json' > '$LOGS/variants-b16.log' 2>&1 &
    wait; tail -n 25 '$LOGS/variants-b32.log' '$LOGS/variants-b16.log'"
stage gpu_tests 90 python3 -m pytest -q -m gpu tests/trainer
finish variants
