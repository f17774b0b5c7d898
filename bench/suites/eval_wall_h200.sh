#!/usr/bin/env bash
# `eval`'s wall time in one uncontended process on one H200 (5.13's and 5.14's speed-ups were 16 shards sharing
# the GPU): S17's 121k-conversation SmolLM2 drafter (`runs/s17/export/export`, carried as .carry4/export) on every
# EVAL_NTH-th HumanEval prompt (4: 41 prompts), 128 new tokens, beside prompt lookup and target-only greedy, all
# three in the one process. Needs the SmolLM2 target in runs/smollm2-135m/target: run it on a machine where
# context_h200.sh (or quality_h200.sh) `start`/`data` converted it, within the 30 s idle window (~5 min):
#   run(carry=[".carry4"], timeout_s=420, command="bash bench/suites/eval_wall_h200.sh")
# .carry4/export: mkdir -p .carry4 && cp -r runs/s17/export/export .carry4/export (37 MB; the tree is ~12 MiB).
# Results: $OUT/results-eval_wall.json ($RES/eval_wall.json is eval's own --json report).
# CPU dry run: SUITE_TINY=1 EVAL_NTH=82 EVAL_NEW_TOKENS=8 OUT=/tmp/x PATH=.venv/bin:$PATH bash bench/suites/eval_wall_h200.sh
set -u
cd "$(dirname "$0")/../.."
SUITE_BUDGET_S=${SUITE_BUDGET_S:-400}
source bench/lib/suite_lib.sh
ROOT=runs/smollm2-135m
[ -f "$ROOT/target/config.json" ] || { echo "no $ROOT/target here: run context_h200.sh start first (same machine)"; exit 1; }
[ -f .carry4/export/config.json ] || { echo "no .carry4/export: carry it (see the header)"; exit 1; }
awk "NR % ${EVAL_NTH:-4} == 1" "$ROOT/prompts/humaneval.jsonl" >/tmp/eval_wall_prompts.jsonl
wc -l </tmp/eval_wall_prompts.jsonl
stage eval $((SUITE_BUDGET_S - 20)) bash -c "python3 -m dflash_doctor eval --export .carry4/export --config smollm2-135m \
    --prompts /tmp/eval_wall_prompts.jsonl --num-prompts 164 --max-new-tokens ${EVAL_NEW_TOKENS:-128} --json \
    > '$RES/eval_wall.json'"
python3 - "$RES/eval_wall.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
b = r.get("baseline") or {}
print(f"dflash tau {r['mean_accept_len']:.3f} {r['tok_s']:.1f} tok/s; target-only {r['baseline_tok_s']:.1f} tok/s: "
      f"{r['speedup']:.2f}x; prompt lookup tau {b.get('mean_accept_len', 0):.3f} {b.get('speedup', 0):.2f}x; "
      f"{r['prompts']} prompts, {r['new_tokens']} tokens, differences {r['differences']}")
PY
finish eval_wall
