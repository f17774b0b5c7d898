#!/usr/bin/env bash
# Issue 36 on one H200: the KV engine against transformers' generate, then the data it makes, in the calls
# of one lease (the machine keeps /tmp and the ignored runs/ folder between calls while it is warm):
#   shapes  both engines at Qwen3-8B and SmolLM2-135M shapes, random weights (no stop token: every row decodes
#           --max-new-tokens); gguf part 1 (.carry1) copied to /tmp/gguf for the next call
#   data    the SmolLM2 target from the GGUF (part 2 and the prompt sets in .carry2); both engines on the same
#           real chats (rates, identical answers); then `data regenerate` of every training prompt with the
#           default engine for at most KV_REGEN_S seconds; the data back gzipped
#   run(carry=[".whl", ".carry1"], timeout_s=600, command="bash bench/suites/kv_engine_h200.sh shapes")
#   run(carry=[".whl", ".carry2"], timeout_s=600, command="bash bench/suites/kv_engine_h200.sh data")
set -u
cd "$(dirname "$0")/../.."
PHASE=${1:?usage: kv_engine_h200.sh shapes|data}
SUITE_BUDGET_S=${SUITE_BUDGET_S:-570}
source bench/lib/suite_lib.sh
export DFLASH_DOCTOR_HOME=/tmp/kv-home
ROOT=runs/smollm2-135m
stage setup 25 bash -c "install_carried_wheels && if ls .whl/gguf-*.whl >/dev/null 2>&1; then python3 -m pip install -q --no-deps --no-index --target $SITE .whl/gguf-*.whl; fi"
B="-m bench.decode.kv_engine_throughput"
if [ "$PHASE" = shapes ]; then
    if [ -f .carry1/gguf.part1 ]; then mkdir -p /tmp/gguf && cp .carry1/gguf.part1 /tmp/gguf/part1; fi
    [ -n "${ONLY_QWEN3:-}" ] || stage smollm2_shapes 200 python3 $B --target-config bench/decode/shapes/smollm2-135m.json --prompt-lens 100-450 \
        --num 8192 --max-new-tokens 256 --slot-list 2048,4096 --sdpa-too --baseline-batch 2048 --baseline-num 2048 \
        --out "$RES/kv_smollm2_shapes.json"
    stage qwen3_8b 240 python3 $B --target-config bench/decode/shapes/qwen3-8b.json --prompt-lens 100-450 \
        --num 512 --max-new-tokens 128 --slot-list 512 --sdpa-too --baseline-batch 128 --baseline-num 128 \
        --out "$RES/kv_qwen3_8b.json"
    finish kv-shapes
    exit 0
fi
stage convert 120 bash -c 'set -e; mkdir -p "$0/prompts"
    cat /tmp/gguf/part1 .carry2/gguf.part2 > /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
    for f in .carry2/prompts/*.gz; do zcat "$f" > "$0/prompts/$(basename "$f" .gz)"; done
    python3 -c "import sys; from pathlib import Path; from examples.smollm2.convert import convert_gguf
print(convert_gguf(Path(\"/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf\"), Path(sys.argv[1]) / \"target\").to_json())" "$0"' "$ROOT"
stage real 200 python3 $B --target "$ROOT/target" --prompts "$ROOT/prompts/train.jsonl" --num 4096 \
    --max-new-tokens 384 --baseline-batch 2048 --baseline-num 2048 --temperature 0.8 --out "$RES/kv_smollm2_real.json"
stage regenerate "${KV_REGEN_S:-300}" python3 -m dflash_doctor data regenerate --config smollm2-135m \
    --engine torch --prompts "$ROOT/prompts/train.jsonl" --out "$ROOT/data/train.jsonl" --max-new-tokens 384 --json
wc -l "$ROOT/data/train.jsonl"
gzip -c "$ROOT/data/train.jsonl" > /tmp/train.jsonl.gz && split -b 15M /tmp/train.jsonl.gz "$OUT/train.jsonl.gz.part-"
finish kv-data
