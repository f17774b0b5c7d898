#!/usr/bin/env bash
# Issue 38, Q1, with a drafter strong enough for the mismatch to show, on one H200: SmolLM2-135M-Instruct behind
# Qwen3's published template, multi-turn chats opened by 20,000 of the example's training prompts, every answer
# regenerated greedily; the same data trained by the code before the Q1 fix (23dabad~1) and by this checkout
# (the recipe's drafter: 5 layers, block 16, 32 sequences of 1,024 a step, lr 6e-4), each scored by its run's
# held-out walk and by `eval` (bf16) on the held-out conversations' last answers: bench/decode/chat_context.py.
# Calls of one lease, back to back (a machine idle 30 s between two calls goes back with its /tmp):
#   run(carry=[".carry1", ".carry-before"], timeout_s=60, command="bash bench/suites/context_h200.sh setup")
#   run(carry=[".whl"], timeout_s=60, command="bash bench/suites/context_h200.sh wheels")
#   run(carry=[".carry2"], timeout_s=180, command="bash bench/suites/context_h200.sh start")
#   run(timeout_s=600, command="bash bench/suites/context_h200.sh wait")   (again while it runs)
# Measured on S18's H200 (default kwargs, both arms): regenerate ~2 min, each arm's train ~4 min, each arm's eval
# of 100 prompts ~7 min: ~25 min in all, more than a lease holds after its other calls. S18 measured the before
# arm (BENCHMARKS 5.15); CONTEXT_ARMS=after runs this checkout's arm alone (~14 min).
# .carry-before/before.tar.gz: the code before the fix, with today's last-answer walk patched in so that both arms
# report it (bench/decode/patches/before-q1-last-answer.patch: scoring only), made here (the device gets no .git):
#   rm -rf /tmp/mkbefore && mkdir -p /tmp/mkbefore .carry-before && git archive 23dabad~1 -- dflash_doctor trainer \
#       dflash_base checks pyproject.toml | tar -x -C /tmp/mkbefore && (cd /tmp/mkbefore && patch -p1 -s < \
#       "$OLDPWD/bench/decode/patches/before-q1-last-answer.patch" && tar -czf "$OLDPWD/.carry-before/before.tar.gz" \
#       dflash_doctor trainer dflash_base checks pyproject.toml)
# .carry1, .carry2, .whl: as for bench/suites/quality_h200.sh (the GGUF in two parts, the prompt sets, the wheels).
# CONTEXT_NOTHINK=1 runs the `enable_thinking = false` case after the default one (~14 min more an arm).
# CONTEXT_ARGS overrides the sizes (e.g. "--conversations 4000 --steps 300" for a shorter run). A CPU dry run of the
# plumbing: OUT=/tmp/ctx-out PATH=.venv/bin:$PATH CONTEXT_DEVICE=cpu CONTEXT_ARGS="--conversations 6 --steps 2
# --layers 1 --block-size 4 --seq-len 256 --batch-size 2 --anchors 8 --max-new-tokens 8 --eval-prompts 2
# --eval-fraction 0.34 --regenerate-batch 8" with the phases in order (SITE=/nonexistent: no wheels to install).
set -u
cd "$(dirname "$0")/../.."
PHASE=${1:?usage: context_h200.sh setup|wheels|start|wait}
case "$PHASE" in
    wait) SUITE_BUDGET_S=${SUITE_BUDGET_S:-570} ;;
    *) SUITE_BUDGET_S=${SUITE_BUDGET_S:-170} ;;
esac
source bench/lib/suite_lib.sh
export DFLASH_DOCTOR_HOME=/tmp/context-home
unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
ROOT=runs/smollm2-135m
WORK=/tmp/context
DONE=$WORK/finished

case "$PHASE" in
setup)
    mkdir -p /tmp/gguf && cp .carry1/gguf.part1 /tmp/gguf/part1 && echo "gguf part 1 in /tmp/gguf"
    rm -rf /tmp/before && mkdir -p /tmp/before && tar -xzf .carry-before/before.tar.gz -C /tmp/before &&
        echo "the code before the fix in /tmp/before: $(ls /tmp/before | tr '\n' ' ')"
    gpu_facts
    finish context-setup
    ;;
wheels)
    stage wheels 60 bash -c install_carried_wheels
    finish context-wheels
    ;;
start)
    stage convert 120 bash -c 'smollm2_target "$0"' "$ROOT"
    rm -rf "$WORK" && mkdir -p "$WORK"
    before=(--before /tmp/before)
    [ "${CONTEXT_ARMS:-both}" = after ] && before=()
    common=("${before[@]}" --target "$ROOT/target" --first-prompts "$ROOT/prompts/train.jsonl"
        --conversations 20000 --turns 3 --max-new-tokens 128 --regenerate-batch 2048 --steps 1500 --layers 5
        --block-size 16 --seq-len 1024 --batch-size 32 --anchors 256 --lr 6e-4 --eval-fraction 0.05
        --eval-prompts 100 --eval-shards 16 --log-every 100 --timeout-s 1500 --device "${CONTEXT_DEVICE:-cuda}" --work "$WORK"
        ${CONTEXT_ARGS:-})
    script="python3 -u -m bench.decode.chat_context ${common[*]} --tag smollm2-gpu > $WORK/default.log 2>&1"
    if [ -n "${CONTEXT_NOTHINK:-}" ]; then
        script+="; python3 -u -m bench.decode.chat_context ${common[*]} --kwargs '{\"enable_thinking\": false}'"
        script+=" --tag smollm2-gpu-nothink > $WORK/nothink.log 2>&1"
    fi
    # in a process session of its own: it runs on after this call returns, while the machine is held
    echo "$script" | tee "$WORK/script.sh"
    setsid nohup bash -c "$script; touch $DONE" >/dev/null 2>&1 </dev/null &
    sleep 20 && tail -n 5 "$WORK"/*.log
    finish context-start
    ;;
wait)
    [ -d "$WORK" ] || { echo "no run on this machine ($WORK is missing): a new machine; run setup, wheels, start"; exit 1; }
    waited() {
        until [ -f "$DONE" ]; do
            tail -n 2 "$WORK"/*.log 2>/dev/null | cut -c1-200
            sleep 30
        done
    }
    export WORK DONE
    export -f waited
    stage wait $((SUITE_BUDGET_S - 30)) bash -c waited
    cp bench/results/chat_context-smollm2-gpu*.json "$RES/" 2>/dev/null
    cp "$WORK"/*.log "$LOGS/" 2>/dev/null
    for tag in smollm2-gpu smollm2-gpu-nothink; do  # each run's metrics and summaries, and its eval reports
        for code in before after; do
            cp "$WORK/$tag/run-$code/summary.json" "$RES/summary-$tag-$code.json" 2>/dev/null
            cp "$WORK/$tag/run-$code/metrics.jsonl" "$LOGS/metrics-$tag-$code.jsonl" 2>/dev/null
            cp "$WORK/$tag/eval-$code.json" "$LOGS/eval-$tag-$code.json" 2>/dev/null
        done
    done
    [ -f "$DONE" ] && echo "finished" || echo "still running: call wait again"
    finish context-wait
    ;;
*)
    echo "unknown phase $PHASE: setup, wheels, start or wait" >&2
    exit 2
    ;;
esac
