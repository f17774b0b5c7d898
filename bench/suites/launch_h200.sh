#!/usr/bin/env bash
# Issue 40 §2's latency table on one H200, in one device call (~300 s: the cold b16 launch ~130 s with its probe,
# checkpoint and export, warm ~40 s, seed-b32 ~90 s, check ~20 s), every launch with DFLASH_DOCTOR_DEBUG=1 and its
# stderr kept (S12's two launches ended 3 with no traceback):
#   1. time_to_first_step qwen3-8b-b16: cold (a fresh home), then warm (the same launch again)
#   2. the first launch of a second config: seed-b32, cold, in the b16 home (its cache warm for another config)
#   3. `check` first and warm (bench/check/check_speed.py), then bench/doctor/check_speed.py with what is left
# Results: $OUT/results-launch_h200.json; each launch's stdout/stderr, run records and the cache listing in the logs.
#   run(kind="nvidia-h200", carry=[".whl"], timeout_s=480, command="bash bench/suites/launch_h200.sh")
# CPU dry run of the plumbing (tiny-cpu for both configs): SUITE_TINY=1 OUT=/tmp/x PATH=.venv/bin:$PATH bash bench/suites/launch_h200.sh
set -u
cd "$(dirname "$0")/../.."
SUITE_BUDGET_S=${SUITE_BUDGET_S:-450}
source bench/lib/suite_lib.sh
unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
B16=qwen3-8b-b16 B32=seed-b32
[ -n "$SUITE_TINY" ] && B16=tiny-cpu B32=tiny-cpu
W=${LAUNCH_WORKDIR:-/tmp/ttfs}
rm -rf "$W" "$W-b32"
stage setup 25 bash -c install_carried_wheels
stage ttfs_b16 240 python3 -m bench.launch.time_to_first_step --workdir "$W" --config "$B16" \
    --json "$RES/ttfs-$B16.json"
stage ttfs_b32_second 150 python3 -m bench.launch.time_to_first_step --workdir "$W-b32" --home "$W/home" \
    --only cold --config "$B32" --json "$RES/ttfs-$B32-second-config.json"
stage check_first_warm 60 python3 -m bench.check.check_speed --rounds 3 --warm 3 --json "$RES/check_speed_40.json"
stage check_speed 60 bash -c "python3 -m bench.doctor.check_speed --repeat 3 \$(which python3) && \
    cp bench/results/check_speed.json '$RES/check_speed_doctor.json'"
git checkout -q bench/results/check_speed.json 2>/dev/null || true  # the script writes there: the checkout keeps its own
for f in "$W"/out-* "$W-b32"/out-*; do [ -f "$f" ] && cp "$f" "$LOGS/$(basename "$(dirname "$f")")-$(basename "$f")"; done
for r in "$W"/home/state/runs/*/record.json; do [ -f "$r" ] && cp "$r" "$LOGS/record-$(basename "$(dirname "$r")").json"; done
(cd "$W/home/cache" 2>/dev/null && find . -printf '%y %s %p\n' | sort -k3) >"$LOGS/cache-listing.txt"
finish launch_h200
