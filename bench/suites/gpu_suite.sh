#!/usr/bin/env bash
# The 1-GPU H200 suite (issue 7): per-role numbers on one GPU, the warm start, the deep report, the GPU tests.
# Run from the repo root on the device machine (the .whl/ folder carried). Everything comes back in $OUT:
# results-1gpu.json (every benchmark's JSON, by name) and logs-1gpu.tar.gz (each stage's full output).
# Stage limits sum to more than the budget on purpose: a stage gets min(its limit, what is left).
# CPU dry run of the plumbing: SUITE_TINY=1 OUT=/tmp/x PATH=.venv/bin:$PATH bench/suites/gpu_suite.sh
set -u
cd "$(dirname "$0")/../.."
source bench/lib/suite_lib.sh
if [ -n "$SUITE_TINY" ]; then WARM_SHAPES=(--device cpu); else
    WARM_SHAPES=(--device cuda --heads 32 --head-dim 128 --kv-heads 8 --anchors 1024 --block 32 --context 40000)
fi

stage setup 25 bash -c install_carried_wheels
stage gpu_facts 15 bash -c gpu_facts
stage target_capture 90 python3 -m bench.kernels.target_capture $TINY --out "$RES/target_capture.json"
stage drafter_variants 205 python3 -m bench.kernels.drafter_variants $TINY --budget-s 170 --repeats 4 \
    --out "$RES/drafter_variants.json"
stage warm_start 85 python3 -m bench.cache.warm_start "${WARM_SHAPES[@]}" --out "$RES/warm_start.json"
stage check_deep 45 sh -c "python3 -m dflash_doctor check --deep --json > '$RES/check_deep.json'"
stage probe 35 python3 -m dflash_doctor probe --out "$RES/probe.json"
stage pytest_gpu 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/trainer
stage role_rates 15 python3 -m bench.kernels.role_rates --results "$RES" --out "$RES/role_rates.json"
finish 1gpu
