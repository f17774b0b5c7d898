#!/usr/bin/env bash
# Issue 28 on one H200, in one call, what S8 left unmeasured with the default flags (overlap_capture "auto":
# the next capture on a second stream on CUDA):
#   1. seed-b32, 12 steps, no flags (the story's shapes; cold compile)
#   2. qwen3-8b-b16, 60 steps, no flags, with a profiler window over steps 30-34: where the drafter step goes
#      (top kernels and the GPU's busy share, from <output>/profile/rank0.summary.json)
# Every run folder is deleted after it is read (a b16 run leaves ~14 GB; the machine has 64 GB).
#   run(carry=[".whl"], timeout_s=600, command="bash bench/suites/step_h200.sh")
set -u
cd "$(dirname "$0")/../.."
SUITE_BUDGET_S=${SUITE_BUDGET_S:-560}
source bench/lib/suite_lib.sh
export DFLASH_DOCTOR_HOME=/tmp/step-home
unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
stage setup 25 bash -c install_carried_wheels
stage b32_default 200 python3 -m bench.e2e.e2e --config seed-b32 --steps 12 --timeout-s 190 --no-deep \
    --workdir /tmp/st-1 --out "$RES/b32_default.json"
left=$((SUITE_BUDGET_S - ($(date +%s) - SUITE_START) - 20))
stage b16_profile "$left" python3 -m bench.e2e.e2e --config qwen3-8b-b16 --steps 60 --timeout-s $((left - 10)) \
    --no-deep --keep-output --workdir /tmp/st-2 --out "$RES/b16_profile.json" \
    --set profile.start=30 --set profile.steps=5
cp /tmp/st-2/*/profile/*.summary.json "$RES/" 2>/dev/null
rm -rf /tmp/st-2
for f in /tmp/st-*/*.log; do cp "$f" "$LOGS/$(basename "$(dirname "$f")")-$(basename "$f")"; done
print_profiles "$RES" 15
df -h /tmp | tail -1
finish step
