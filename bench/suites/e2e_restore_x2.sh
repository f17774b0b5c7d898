#!/usr/bin/env bash
# 1 target + 1 drafter end to end on two H200s through `dflash-doctor train` (issue 7). Runs, in order:
#   cold      empty compile cache: the launcher's warm-up child compiles the drafter on cuda:1, the target
#             rank compiles its layers on its first capture; the launcher snapshots the cache after success.
#             Skipped when .snap/ holds a snapshot from an earlier call (carry=[".whl", ".snap"]).
#   restored  the managed cache deleted: the launcher restores the newest snapshot, then runs
#   fresh     a fresh machine: the managed cache, the warm-up records and every snapshot but the newest
#             deleted; the newest (taken after the run before) carries its warm-up record, so the launcher
#             restores it and skips the warm-up child (cache/warm_record.py)
#   warm      the cache left in place
# Time to first step, steady tok/s, the drafter's data-wait fraction, and the start-up lines for each.
#   run(kind="nvidia-h200-x2", carry=[".whl", ".snap"], timeout_s=600, command="bash bench/suites/e2e_restore_x2.sh")
# E2E_RUNS picks runs (default "restored fresh warm"; a run that would get under 90 s is skipped; "bytecode"
# compiles site-packages' bytecode first, the startup.bytecode remedy, then runs warm); E2E_GPU_TESTS=1
# runs the GPU-marked trainer tests first; E2E_IMPORTS=1 measures import times first (bench/e2e/import_times.sh);
# E2E_COLOCATED=1 first measures the colocated baseline (bench/kernels/colocated.py, ~3.5 minutes) and compares every
# 1+1 run with it. The newest snapshot comes back as $OUT/e2e-snapshot.tar.zst: put it in .snap/ for next time.
# CPU dry run of the plumbing: SUITE_TINY=1 OUT=/tmp/x PATH=.venv/bin:$PATH bash bench/suites/e2e_restore_x2.sh
set -u
cd "$(dirname "$0")/../.."
SUITE_BUDGET_S=${SUITE_BUDGET_S:-585}
source bench/lib/suite_lib.sh
export DFLASH_DOCTOR_HOME=${DFLASH_DOCTOR_HOME:-/tmp/e2e-ddhome}
unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR

stage setup 25 bash -c install_carried_wheels
# E2E_GPU_TESTS=1: the GPU-marked trainer tests first (flex vs SDPA forward and backward, the dense guard).
[ -n "${E2E_GPU_TESTS:-}" ] && stage pytest_gpu 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/trainer
[ -n "${E2E_IMPORTS:-}" ] && IMPORT_QUICK=1 IMPORT_ROUNDS=1 IMPORT_TAG=before stage imports_before 90 bash bench/e2e/import_times.sh
INDUCTOR=$(python3 -c "from dflash_doctor.cache.locations import managed_inductor_dir as d; print(d())")
STORE=$DFLASH_DOCTOR_HOME/cache/snapshots
RECORDS=$DFLASH_DOCTOR_HOME/cache/warm-records.json
echo "managed cache: $INDUCTOR"
E2E=(python3 -m bench.e2e.e2e $TINY --config qwen3-8b-b16 --no-deep)
left() { echo $((SUITE_BUDGET_S - ($(date +%s) - SUITE_START))); }
newest_snapshot() { ls -t "$STORE"/*.tar.zst 2>/dev/null | head -n 1; }
bytecode_facts() {  # why this interpreter compiles its imports from source, and what the check says of it
    env | grep '^PYTHON'
    python3 -c 'import sys; print("dont_write_bytecode", sys.flags.dont_write_bytecode, "pycache_prefix", sys.pycache_prefix)'
    python3 -m dflash_doctor check --json > "$RES/check_before_bytecode.json"
    python3 - "$RES/check_before_bytecode.json" <<'PY'
import json, sys
for finding in json.load(open(sys.argv[1]))["findings"]:
    if str(finding.get("id", "")).startswith("startup"):
        print(json.dumps(finding)[:1500])
PY
}
export RES
export -f bytecode_facts

e2e_run() {  # NAME STEPS NEED_S: one `train` through bench/e2e/e2e.py, its log kept
    local name=$1 steps=$2 need=$3 limit
    limit=$(( $(left) - 30 ))
    if [ "$limit" -lt "$need" ]; then
        STAGE_LINES+=("$(printf '%-18s SKIPPED (%s s left, needs %s)' "e2e_$name" "$limit" "$need")")
        return 0
    fi
    stage "e2e_$name" $((limit + 20)) "${E2E[@]}" --steps "$steps" --timeout-s "$limit" --workdir "/tmp/e2e-$name" \
        --out "$RES/e2e-$name.json"
    cp /tmp/e2e-"$name"/*.log "$LOGS/$name-train.log" 2>/dev/null
    tail -n 25 "$LOGS/$name-train.log" 2>/dev/null
    # Kept for a later call (a name without ':' or '+': it comes back).
    [ -n "$(newest_snapshot)" ] && cp "$(newest_snapshot)" "$OUT/e2e-snapshot.tar.zst"
}

CARRIED=$([ -z "$SUITE_TINY" ] && ls .snap/*.tar.zst 2>/dev/null | head -n 1)  # H200 snapshots: not for a CPU dry run
if [ -n "$CARRIED" ]; then
    # A snapshot an earlier call made on this kind of machine: no cold run needed.
    mkdir -p "$STORE" && cp "$CARRIED" "$STORE/train-carried.tar.zst" && echo "carried snapshot: $CARRIED"
else
    # The cold run pays every compile (about 4 minutes on an H200) and leaves the snapshot; 3 steps suffice.
    e2e_run cold 3 200
fi
if [ -n "${E2E_COLOCATED:-}" ]; then
    # The colocated baseline in the same call: target then drafter in one process on cuda:0, from the snapshot
    # (its first iteration is not what it measures); every 1+1 run below is then compared with two such GPUs.
    stage coloc_restore 30 env TORCHINDUCTOR_CACHE_DIR="$INDUCTOR" python3 -m dflash_doctor cache restore \
        "$(newest_snapshot)"
    stage colocated 320 env TORCHINDUCTOR_CACHE_DIR="$INDUCTOR" python3 -m bench.kernels.colocated $TINY \
        --config qwen3-8b-b16 --out "$RES/colocated.json"
    [ -s "$RES/colocated.json" ] && E2E+=(--colocated-json "$RES/colocated.json")
fi
for run in ${E2E_RUNS:-restored fresh warm}; do
    case $run in
        restored)
            stage wipe 10 bash -c "du -sh '$INDUCTOR'; rm -rf '$INDUCTOR'; ls -la '$STORE'"
            e2e_run restored 6 100 ;;
        fresh)
            stage fresh_home 10 bash -c "rm -rf '$INDUCTOR' '$RECORDS'; newest=\$(ls -t '$STORE'/*.tar.zst | head -n 1); \
                for f in '$STORE'/*.tar.zst; do [ \"\$f\" = \"\$newest\" ] || rm -f \"\$f\"; done; \
                python3 -m dflash_doctor cache list --json > '$RES/cache_list_fresh.json'; ls -la '$STORE'"
            e2e_run fresh 6 90 ;;
        warm) e2e_run warm 6 90 ;;
        bytecode)
            # The startup.bytecode remedy applied (checks/startup.py), then a warm run: how much of each
            # process's start-up was compiling imports from source. In place when site-packages is writable,
            # else into a PYTHONPYCACHEPREFIX folder that every later process is pointed at.
            stage bytecode_facts 20 bash -c bytecode_facts
            SITE_PACKAGES=$(python3 -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
            [ -w "$SITE_PACKAGES/torch" ] || export PYTHONPYCACHEPREFIX=/tmp/pycache-prefix
            stage compileall 150 python3 -m compileall -q -j 0 "$SITE_PACKAGES"
            IMPORT_QUICK=1 IMPORT_ROUNDS=1 IMPORT_TAG=after stage imports_after 90 bash bench/e2e/import_times.sh
            e2e_run bytecode 6 90 ;;
        *) echo "E2E_RUNS: unknown run '$run' (restored, fresh, warm, bytecode)"; exit 2 ;;
    esac
done
finish e2e
