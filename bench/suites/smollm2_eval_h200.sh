#!/usr/bin/env bash
# Issue 27, the call after bench/suites/smollm2_h200.sh (same machine, the run still under runs/smollm2-135m):
#   `dflash-doctor eval` of the trained drafter beside prompt lookup (the default baseline), bf16 (ties classified):
#   - on HumanEval's 164 prompts, in 6 shards at once on the one GPU (acceptance is per prompt, so sharding
#     changes no tau; wall-clock speed-ups are measured under the shards' contention: the ratio is what counts)
#   - on 32 held-out conversations (at the same time) of the run (the same data the training's held-out estimate scored)
# Back: one tar of the results, and the export in parts under 16 MiB (for an fp32 --strict check on a CPU).
#   run(kind="nvidia-h200", timeout_s=600, command="bash bench/suites/smollm2_eval_h200.sh")
set -u
cd "$(dirname "$0")/../.."
SUITE_BUDGET_S=${SUITE_BUDGET_S:-540}
source bench/lib/suite_lib.sh
export DFLASH_DOCTOR_HOME=/tmp/smollm2-home
ROOT=runs/smollm2-135m
NEW_TOKENS=${SMOLLM2_EVAL_NEW_TOKENS:-256}
ARGS=(--export "$ROOT/run/export" --config smollm2-135m --max-new-tokens "$NEW_TOKENS")
both() {  # HumanEval in 6 shards and the held-out conversations, all at once
    python3 -m dflash_doctor eval "$@" --num-prompts 32 --json > "$RES/eval_heldout.json" 2> "$LOGS/eval_heldout.err" &
    python3 bench/decode/eval_shards.py --shards 6 --prompts "$ROOT/prompts/humaneval.jsonl" \
        --out "$RES/eval_humaneval.json" -- "$@"
    wait
}
stage eval $((SUITE_BUDGET_S - 45)) bash -c "$(declare -f both); ROOT=$ROOT RES=$RES LOGS=$LOGS both \"\$@\"" _ "${ARGS[@]}"
cp "$ROOT/run/metrics.jsonl" "$ROOT/run/summary.json" "$RES/" 2>/dev/null
tar -cf /tmp/export.tar -C "$ROOT/run" export && split -b 15M /tmp/export.tar "$OUT/export.tar.part-"
finish smollm2_eval
