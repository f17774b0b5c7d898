#!/usr/bin/env bash
# The README's command with no flags, on a fresh GPU machine (issues 16 and 17), every run in this one call:
#   1. `train --config qwen3-8b-b16` first ever (empty dflash-doctor home, empty compile caches; deep probe on)
#   2. the same again (other output.dir): the passed probe reused, the warm-up skipped
#   3. `train --config seed-b32` (new shapes: a cold compile, the probe reused)
#   4. bench/kernels/layer_compile.py at qwen3-8b-b16, then seed-b32, with what is left (per-layer against whole-stack)
# FIRST_LAUNCH_B32=0 leaves out run 3.
# Each train is a bench/e2e/e2e.py row: time to first step, steady tok/s, data wait, the launcher's start-up lines.
#   run(kind="nvidia-h200", carry=[".whl"], timeout_s=600, command="bash bench/suites/first_launch.sh")
set -u
cd "$(dirname "$0")/../.."
SUITE_BUDGET_S=${SUITE_BUDGET_S:-585}
source bench/lib/suite_lib.sh
export DFLASH_DOCTOR_HOME=/tmp/first-launch-home
unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
stage setup 25 bash -c install_carried_wheels
stage first_b16 200 python3 -m bench.e2e.e2e --config qwen3-8b-b16 --steps 60 --timeout-s 190 \
    --workdir /tmp/first-launch-1 --out "$RES/first_b16.json"
stage second_b16 90 python3 -m bench.e2e.e2e --config qwen3-8b-b16 --steps 60 --timeout-s 80 \
    --workdir /tmp/first-launch-2 --out "$RES/second_b16.json"
[ "${FIRST_LAUNCH_B32:-1}" = 1 ] && stage first_b32 150 python3 -m bench.e2e.e2e --config seed-b32 --steps 12 --timeout-s 140 \
    --workdir /tmp/first-launch-3 --out "$RES/first_b32.json"
for f in /tmp/first-launch-*/*.log; do cp "$f" "$LOGS/$(basename "$(dirname "$f")")-$(basename "$f")"; done
stage layer_compile_b16 240 python3 -m bench.kernels.layer_compile --config qwen3-8b-b16 --repeats 20 \
    --out "$RES/layer_compile-b16.json"
left=$((SUITE_BUDGET_S - ($(date +%s) - SUITE_START) - 15))
stage layer_compile_b32 "$left" python3 -m bench.kernels.layer_compile --config seed-b32 --repeats 5 \
    --out "$RES/layer_compile-b32.json"
finish first_launch
