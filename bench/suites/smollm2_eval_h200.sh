#!/usr/bin/env bash
# Issue 27, the call after `bench/suites/smollm2_h200.sh train` (same machine, the run still under
# runs/smollm2-135m): `dflash-doctor eval` of the trained drafter beside prompt lookup (the default baseline),
# bf16 (ties classified), all at once on the one GPU (batch-1 decoding leaves it mostly idle):
#   - HumanEval's 164 prompts in SMOLLM2_SHARDS (10) shards, SMOLLM2_EVAL_NEW_TOKENS (128) new tokens
#   - the run's first SMOLLM2_HELDOUT (60) held-out conversations up to their last answer (the data the
#     training's held-out estimate scored), in 6 shards, SMOLLM2_HELDOUT_NEW_TOKENS (192) new tokens
# Acceptance is per prompt, so sharding changes no tau; wall-clock speed-ups are measured under the shards'
# contention (the ratio is what counts). Then, alone on the GPU, `bench/decode/context_cache.py` on the first
# SMOLLM2_SOLO (16) HumanEval prompts: the wall-clock speed-up one process gets, with the drafter's context
# cache and without it. Back: the results, and the export in parts under 16 MiB (for an fp32 --strict check
# on a CPU).
#   run(carry=[".whl"], timeout_s=600, command="bash bench/suites/smollm2_eval_h200.sh")
set -u
cd "$(dirname "$0")/../.."
SUITE_BUDGET_S=${SUITE_BUDGET_S:-560}
source bench/lib/suite_lib.sh
export DFLASH_DOCTOR_HOME=/tmp/smollm2-home
ROOT=runs/smollm2-135m
ARGS=(--export "$ROOT/run/export" --config smollm2-135m)
stage setup 25 bash -c "install_carried_wheels"
stage heldout_file 60 python3 -m bench.decode.heldout_prompts --config smollm2-135m \
    --count "${SMOLLM2_HELDOUT:-60}" --out "$RES/heldout_prompts.jsonl.txt"
both() {  # HumanEval and the held-out conversations, all at once
    python3 -m bench.decode.eval_shards --shards 6 --prompts "$RES/heldout_prompts.jsonl.txt" \
        --out "$RES/eval_heldout.json" -- "$@" --max-new-tokens "${SMOLLM2_HELDOUT_NEW_TOKENS:-192}" &
    python3 -m bench.decode.eval_shards --shards "${SMOLLM2_SHARDS:-10}" --prompts "$ROOT/prompts/humaneval.jsonl" \
        --out "$RES/eval_humaneval.json" -- "$@" --max-new-tokens "${SMOLLM2_EVAL_NEW_TOKENS:-128}"
    wait
}
stage eval $((SUITE_BUDGET_S - ($(date +%s) - SUITE_START) - 30)) bash -c \
    "$(declare -f both); ROOT=$ROOT RES=$RES SMOLLM2_SHARDS=${SMOLLM2_SHARDS:-} both \"\$@\"" _ "${ARGS[@]}"
left=$((SUITE_BUDGET_S - ($(date +%s) - SUITE_START) - 25))
[ "$left" -gt 60 ] && stage solo "$left" python3 -m bench.decode.context_cache --config smollm2-135m \
    --export "$ROOT/run/export" --prompts "$ROOT/prompts/humaneval.jsonl" --num-prompts "${SMOLLM2_SOLO:-16}" \
    --max-new-tokens "${SMOLLM2_EVAL_NEW_TOKENS:-128}" --device cuda --dtype bf16 --out "$RES/eval_solo.json"
rm -f "$RES"/*.shard*.jsonl
cp "$ROOT/run/summary.json" "$RES/" 2>/dev/null
tar -cf /tmp/export.tar -C "$ROOT/run" export && split -b 15M /tmp/export.tar "$OUT/export.tar.part-"
finish smollm2_eval
