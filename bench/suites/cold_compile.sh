#!/usr/bin/env bash
# Where a cold warm-up's seconds go, on a fresh GPU machine (issue 17): bench/cache/cold_compile.py's rows, in order:
#   1. qwen3-8b-b16 (the first compile this machine ever does)   2. qwen3-8b-b16 again (empty caches again)
#   3. qwen3-8b-b16 with a bytecode cache for every process (PYTHONPYCACHEPREFIX)   4. seed-b32
#   run(kind="nvidia-h200", carry=[".whl"], timeout_s=600, command="bash bench/suites/cold_compile.sh")
set -u
cd "$(dirname "$0")/../.."
SUITE_BUDGET_S=${SUITE_BUDGET_S:-580}
source bench/lib/suite_lib.sh
stage setup 25 bash -c install_carried_wheels
left=$((SUITE_BUDGET_S - ($(date +%s) - SUITE_START) - 20))
stage cold_compile "$left" python3 -m bench.cache.cold_compile --budget-s $((left - 60)) --row-timeout 300 \
    --stack-every 15 --stacks-dir "$LOGS/stacks" --out "$RES/cold_compile.json" \
    --row qwen3-8b-b16 --row qwen3-8b-b16 \
    --row qwen3-8b-b16 --env PYTHONPYCACHEPREFIX=/tmp/cold-compile-pyc --env PYTHONDONTWRITEBYTECODE= \
    --row seed-b32
cat "$LOGS/cold_compile.log"
finish cold_compile
