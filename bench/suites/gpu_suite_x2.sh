#!/usr/bin/env bash
# The 2-GPU H200 suite (issue 7): the colocated baseline, then 1 target + 1 drafter end to end through
# `dflash-doctor train` (gate, cache warm, torchrun, real transport) at both recipes.
# Everything comes back in $OUT: results-x2.json and logs-x2.tar.gz.
# The colocated stage compiles into the managed Inductor cache the launcher uses, so the e2e runs start
# from a cache that already holds the flex kernels at these shapes (time to first step: warm, not cold).
# CPU dry run of the plumbing: SUITE_TINY=1 OUT=/tmp/x PATH=.venv/bin:$PATH bench/suites/gpu_suite_x2.sh
set -u
cd "$(dirname "$0")/../.."
SUITE_BUDGET_S=${SUITE_BUDGET_S:-545}
source bench/lib/suite_lib.sh

stage setup 25 bash -c install_carried_wheels
stage gpu_facts 15 bash -c gpu_facts
TORCHINDUCTOR_CACHE_DIR=$(python3 -c "from dflash_doctor.cache.locations import managed_inductor_dir as d; print(d())" \
    2>/dev/null) && export TORCHINDUCTOR_CACHE_DIR
B16=trainer/configs/qwen3-8b-b16.toml
B32=trainer/configs/seed-b32.toml
[ -n "$SUITE_TINY" ] && B16=tiny-cpu && B32=tiny-cpu
# A cold compile of the drafter at b16 took 163 s on the 1-GPU run: the colocated stage pays it once.
stage colocated_b16 200 python3 -m bench.kernels.colocated $TINY --config "$B16" --repeats 3 --out "$RES/colocated.json"
stage e2e_b16 150 python3 -m bench.e2e.e2e $TINY --config qwen3-8b-b16 --steps 40 --timeout-s 140 \
    --colocated-json "$RES/colocated.json" --out "$RES/e2e-qwen3-8b-b16.json"
stage colocated_b32 80 python3 -m bench.kernels.colocated $TINY --config "$B32" --repeats 2 --out "$RES/colocated-b32.json"
stage e2e_b32 110 python3 -m bench.e2e.e2e $TINY --config seed-b32 --steps 10 --skip 3 --no-deep --timeout-s 100 \
    --colocated-json "$RES/colocated-b32.json" --out "$RES/e2e-seed-b32.json"
# Bring the warm compile cache home (the train runs snapshot it) so a later session can restore it.
stage cache_home 10 bash -c 'python3 -m dflash_doctor cache list --json > "$RES/cache_list.json"; \
    f=$(ls -t "$(python3 -c "from dflash_doctor.cache.locations import snapshots_dir as d; print(d())")"/* | head -1); \
    [ -n "$f" ] && [ "$(stat -c %s "$f")" -lt 16000000 ] && cp "$f" "$OUT/" ; ls -la "$f"' 
finish x2
