#!/usr/bin/env bash
# Per-role measurements on two H200s at once, one lane per GPU (issue 7), in one device call:
#   lane cuda:1  the drafter: `trainer` row at qwen3-8b-b16 (profiled) in a fresh cache, that cache
#                snapshotted into $OUT (a later 1+1 run restores it: its drafter rank is cuda:1), then the
#                variant rows and the seed-b32 rows in a copy of that cache
#   lane cuda:0  the target capture rows (default, cuDNN attention, compiled layers, both), then the GPU tests
# Everything comes back in $OUT: results-roles.json, logs-roles.tar.gz, the cache snapshot.
#   run(kind="nvidia-h200-x2", carry=[".whl"], timeout_s=600, command="bash bench/suites/gpu_roles_x2.sh")
# CPU dry run of the plumbing: SUITE_TINY=1 OUT=/tmp/x PATH=.venv/bin:$PATH bash bench/suites/gpu_roles_x2.sh
set -u
cd "$(dirname "$0")/../.."
SUITE_BUDGET_S=${SUITE_BUDGET_S:-540}
source bench/lib/suite_lib.sh

stage setup 25 bash -c install_carried_wheels
stage gpu_facts 15 bash -c gpu_facts
D1=cuda:1 D0=cuda:0
[ -n "$SUITE_TINY" ] && D1=cpu D0=cpu
B16=qwen3-8b-b16 B32=seed-b32
[ -n "$SUITE_TINY" ] && B32=tiny-cpu
CACHE_A=/tmp/roles-cache-a CACHE_B=/tmp/roles-cache-b

drafter_lane() {
    export TORCHINDUCTOR_CACHE_DIR=$CACHE_A
    stage drafter_trainer 300 python3 -m bench.kernels.drafter_variants $TINY --device $D1 --config $B16 --variant trainer \
        --repeats 5 --out "$RES/drafter_trainer.json"
    stage snapshot 20 bash -c "python3 -m dflash_doctor cache snapshot --out '$OUT/drafter-b16-$D1.tar.zst' --json \
        > '$RES/snapshot.json'; s=\$(stat -c %s '$OUT/drafter-b16-$D1.tar.zst'); echo size \$s; \
        [ \"\$s\" -lt 16000000 ] || rm -f '$OUT/drafter-b16-$D1.tar.zst'"
    cp -a "$CACHE_A" "$CACHE_B" 2>/dev/null
    export TORCHINDUCTOR_CACHE_DIR=$CACHE_B
    stage drafter_b32 170 python3 -m bench.kernels.drafter_variants $TINY --device $D1 --config $B32 --variant trainer \
        --repeats 3 --out "$RES/drafter_b32.json"
    stage drafter_variants 400 python3 -m bench.kernels.drafter_variants $TINY --device $D1 --config $B16 \
        --variant "last session" --variant "recompute head" --variant "eager layers" --variant "eager loss" \
        --variant "chunk 4096" --repeats 5 --out "$RES/drafter_variants.json"
    printf '%s\n' "${STAGE_LINES[@]}" > "$LOGS/lane-drafter.txt"
}

target_lane() {
    export TORCHINDUCTOR_CACHE_DIR=/tmp/roles-cache-target
    stage target_capture 330 python3 -m bench.kernels.target_capture $TINY --device $D0 --no-full --repeats 4 \
        --out "$RES/target_capture.json"
    stage pytest_gpu 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/trainer
    printf '%s\n' "${STAGE_LINES[@]}" > "$LOGS/lane-target.txt"
}

drafter_lane > "$LOGS/lane-drafter.out" 2>&1 &
target_lane > "$LOGS/lane-target.out" 2>&1 &
wait
cat "$LOGS/lane-drafter.out" "$LOGS/lane-target.out"
STAGE_LINES+=("--- drafter lane" "$(cat "$LOGS/lane-drafter.txt")" "--- target lane" "$(cat "$LOGS/lane-target.txt")")
finish roles
ls -la "$OUT"
