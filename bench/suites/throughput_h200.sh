#!/usr/bin/env bash
# Issue 28 on one H200, in one device call: what a user gets with no flags, with the corrected arithmetic
# (a step's window holds its own capture; tokens / seconds over the steady steps), and the second-stream
# capture (`topology.overlap_capture="step"`) beside it, at both shipped GPU recipes:
#   1. qwen3-8b-b16, 60 steps, no flags (colocated: `auto` on one GPU)      (cold: compiles)
#   2. qwen3-8b-b16, 60 steps, overlap_capture="step"                       (warm)
#   3. seed-b32, 12 steps, no flags                                         (cold for these shapes)
#   4. seed-b32, 12 steps, overlap_capture="step"                           (warm; with what time is left)
# Every run folder is deleted after it is read (a b16 run leaves ~14 GB; the machine has 64 GB).
#   bash bench/suites/carried_wheels.sh; run(kind="nvidia-h200", carry=[".whl"], timeout_s=600,
#       command="bash bench/suites/throughput_h200.sh")
set -u
cd "$(dirname "$0")/../.."
SUITE_BUDGET_S=${SUITE_BUDGET_S:-560}  # 340 when a second suite follows in the same lease
source bench/lib/suite_lib.sh
export DFLASH_DOCTOR_HOME=/tmp/throughput-home
unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
STEP='topology.overlap_capture="step"'
stage setup 25 bash -c install_carried_wheels
stage b16_default 190 python3 -m bench.e2e.e2e --config qwen3-8b-b16 --steps 60 --timeout-s 180 --no-deep \
    --workdir /tmp/tp-1 --out "$RES/b16_default.json"
stage b16_step 80 python3 -m bench.e2e.e2e --config qwen3-8b-b16 --steps 60 --timeout-s 75 --no-deep \
    --set "$STEP" --workdir /tmp/tp-2 --out "$RES/b16_step.json"
stage b32_default 150 python3 -m bench.e2e.e2e --config seed-b32 --steps 12 --timeout-s 140 --no-deep \
    --workdir /tmp/tp-3 --out "$RES/b32_default.json"
left=$((SUITE_BUDGET_S - ($(date +%s) - SUITE_START) - 20))
stage b32_step "$left" python3 -m bench.e2e.e2e --config seed-b32 --steps 12 --timeout-s $((left - 10)) --no-deep \
    --set "$STEP" --workdir /tmp/tp-4 --out "$RES/b32_step.json"
for f in /tmp/tp-*/*.log; do cp "$f" "$LOGS/$(basename "$(dirname "$f")")-$(basename "$f")"; done
df -h /tmp | tail -1
finish throughput
