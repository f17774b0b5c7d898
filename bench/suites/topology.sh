#!/usr/bin/env bash
# Topologies end to end through `dflash-doctor train` (issue 16), every run in this one call:
#   1 GPU:  colocated at qwen3-8b-b16 (60 steps), then colocated at seed-b32 (12 steps)
#   2 GPUs: colocated on both (what `auto` picks), the 1+1 split (--set topology.targets=1 drafters=1), then
#           colocated on one GPU (topology.ranks=1), all at qwen3-8b-b16
# Each run is a bench/e2e/e2e.py row (steady tok/s, data wait, time to first step, NVML peaks); bench/e2e/topology_table.py
# puts them side by side (vs the 1+1 measured here, vs the rates table's projection) into $OUT/topology.json.
#   run(kind="nvidia-h200",    carry=[".whl"], timeout_s=600, command="bash bench/suites/topology.sh")
#   run(kind="nvidia-h200-x2", carry=[".whl"], timeout_s=600, command="bash bench/suites/topology.sh")
# The first run of a call compiles everything in the launcher's warm-up child (target and drafter layers on
# each device: about 3 minutes cold on an H200); later runs restore or reuse that cache.
# CPU dry run of the plumbing: SUITE_TINY=1 OUT=/tmp/x PATH=.venv/bin:$PATH bash bench/suites/topology.sh
set -u
cd "$(dirname "$0")/../.."
SUITE_BUDGET_S=${SUITE_BUDGET_S:-585}
RES=${RES:-/tmp/topology-suite/results}  # only this call's rows go into the table
LOGS=${LOGS:-/tmp/topology-suite/logs}
rm -rf "$RES" "$LOGS"
source bench/lib/suite_lib.sh
export DFLASH_DOCTOR_HOME=${DFLASH_DOCTOR_HOME:-/tmp/topology-ddhome}
unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR

stage setup 25 bash -c install_carried_wheels
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
# TOPOLOGY_GPU_TESTS=1: colocated on CUDA with compiled target and drafter layers, as a test, first.
[ -n "${TOPOLOGY_GPU_TESTS:-}" ] && [ "$GPUS" -ge 1 ] && stage pytest_gpu 150 python3 -m pytest -m gpu -q \
    -p no:cacheprovider tests/trainer/runs/test_colocated.py
echo "GPUs: $GPUS"
left() { echo $((SUITE_BUDGET_S - ($(date +%s) - SUITE_START))); }

run_e2e() {  # NAME CONFIG STEPS NEED_S [--set ...]: one `train` through bench/e2e/e2e.py, if the budget allows
    local name=$1 config=$2 steps=$3 need=$4 limit
    shift 4
    limit=$(( $(left) - 20 ))
    if [ "$limit" -lt "$need" ]; then
        STAGE_LINES+=("$(printf '%-18s SKIPPED (%s s left, needs %s)' "$name" "$limit" "$need")")
        return 0
    fi
    stage "$name" $((limit + 15)) python3 -m bench.e2e.e2e $TINY --config "$config" --steps "$steps" --no-deep \
        --timeout-s "$limit" --workdir "/tmp/topology-$name" --out "$RES/$name.json" "$@"
    cp /tmp/topology-"$name"/*.log "$LOGS/$name-train.log" 2>/dev/null
}

if [ -n "$SUITE_TINY" ]; then  # CPU: colocated (one process) against the 1+1 split, tiny shapes
    SMALL=(--set data.num_samples=64 --set data.seq_len=64 --set optim.batch_size=4)
    run_e2e colocated-1-tiny tiny-cpu 20 30 "${SMALL[@]}" --set 'topology.mode="colocated"'
    run_e2e split-1p1-tiny tiny-cpu 20 30 "${SMALL[@]}"
elif [ "$GPUS" -ge 2 ]; then
    run_e2e colocated-2-b16 qwen3-8b-b16 60 240 --set topology.ranks=2
    run_e2e split-1p1-b16 qwen3-8b-b16 60 90 --set topology.targets=1 --set topology.drafters=1
    run_e2e colocated-1-b16 qwen3-8b-b16 60 60 --set topology.ranks=1
else
    run_e2e colocated-1-b16 qwen3-8b-b16 60 240
    run_e2e colocated-1-b32 seed-b32 12 150
fi
python3 -m bench.e2e.topology_table "$RES"/*.json --out "$OUT/topology.json"
finish topology
