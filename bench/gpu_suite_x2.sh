#!/usr/bin/env bash
# The 2-GPU H200 suite (issue 7): the colocated baseline, then 1 target + 1 drafter end to end through
# `dflash-doctor train` (gate, cache warm, torchrun, real transport) at both recipes.
# Everything comes back in $OUT: results-x2.json and logs-x2.tar.gz.
# The colocated stage compiles into the managed Inductor cache the launcher uses, so the e2e runs start
# from a cache that already holds the flex kernels at these shapes (time to first step: warm, not cold).
# CPU dry run of the plumbing: SUITE_TINY=1 OUT=/tmp/x PATH=.venv/bin:$PATH bench/gpu_suite_x2.sh
set -u
cd "$(dirname "$0")/.."
source bench/suite_lib.sh

stage setup 25 bash -c install_carried_wheels
stage gpu_facts 15 bash -c gpu_facts
TORCHINDUCTOR_CACHE_DIR=$(python3 -c "from dflash_doctor.cache.locations import managed_inductor_dir as d; print(d())" \
    2>/dev/null) && export TORCHINDUCTOR_CACHE_DIR
stage colocated 170 python3 bench/colocated.py $TINY --repeats 3 --out "$RES/colocated.json"
stage e2e_b16 190 python3 bench/e2e.py $TINY --config qwen3-8b-b16 --steps 60 --timeout-s 160 \
    --colocated-json "$RES/colocated.json" --out "$RES/e2e-qwen3-8b-b16.json"
stage e2e_b32 150 python3 bench/e2e.py $TINY --config seed-b32 --steps 12 --skip 3 --no-deep --timeout-s 120 \
    --colocated-json "$RES/colocated.json" --out "$RES/e2e-seed-b32.json"
finish x2
