# Sourced by bench/suites/gpu_suite.sh and bench/suites/gpu_suite_x2.sh: guarded stages under one time budget, bundling.
#
# stage NAME LIMIT_S COMMAND...   runs COMMAND under `timeout`, its output in $LOGS/NAME.log; the limit is cut
#                                 to what is left of $SUITE_BUDGET_S; a stage that would get < 15 s is skipped.
#                                 A failing stage never stops the suite.
# finish TAG                      prints the stage table, merges $RES/*.json into $OUT/results-TAG.json and packs
#                                 the logs into $OUT/logs-TAG.tar.gz (few files come back from the machine).
# print_profiles DIR [N]          each rank*.summary.json in DIR: the GPU's busy share and its top N operations.

OUT=${OUT:-/tmp/dflash-suite-out}
RES=${RES:-/tmp/dflash-suite/results}
LOGS=${LOGS:-/tmp/dflash-suite/logs}
SUITE_BUDGET_S=${SUITE_BUDGET_S:-520}
SUITE_START=$(date +%s)
STAGE_LINES=()
# SUITE_TINY=1: a CPU dry run of the plumbing (tiny shapes; nothing installed; python3 must have torch).
SUITE_TINY=${SUITE_TINY:-}
TINY=${SUITE_TINY:+--tiny}
SITE=${SITE:-/tmp/site}
mkdir -p "$OUT" "$RES" "$LOGS"
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

stage() {
    local name=$1 limit=$2
    shift 2
    local left=$((SUITE_BUDGET_S - ($(date +%s) - SUITE_START)))
    if [ "$left" -lt 15 ]; then
        STAGE_LINES+=("$(printf '%-18s SKIPPED (suite budget spent)' "$name")")
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "=== $name (limit ${limit}s, $(date +%T))"
    local t0 rc
    t0=$(date +%s)
    timeout -k 10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
    rc=$?
    tail -n 12 "$LOGS/$name.log"
    STAGE_LINES+=("$(printf '%-18s rc=%-4s %4ss of %4ss%s' "$name" "$rc" "$(($(date +%s) - t0))" "$limit" \
        "$([ "$rc" = 124 ] || [ "$rc" = 137 ] && echo '  TIMED OUT')")")
    return 0
}

install_carried_wheels() {
    # The image lacks pyelftools, zstandard, platformdirs (and maybe pytest): carried as wheels in .whl/.
    if [ -z "$SUITE_TINY" ]; then
        python3 -m pip install -q --no-deps --no-index --target "$SITE" .whl/*.whl || unzip_wheels .whl/*.whl
        python3 -c "import pytest" 2>/dev/null || python3 -m pip install -q --no-deps --no-index \
            --target "$SITE" .whl/test/*.whl || unzip_wheels .whl/test/*.whl
    fi
    python3 -c "import elftools, zstandard, platformdirs, pytest; print('carried wheels: ok')"
}

unzip_wheels() {
    # No pip: a wheel is a zip laid out for site-packages.
    SITE=$SITE python3 - "$@" <<'PY'
import os, sys, zipfile
for wheel in sys.argv[1:]:
    zipfile.ZipFile(wheel).extractall(os.environ.get("SITE", "/tmp/site"))
print("unzipped", len(sys.argv) - 1, "wheels")
PY
}

gpu_facts() {
    nvidia-smi --query-gpu=index,name,memory.total,memory.used,clocks.sm,clocks.max.sm,power.draw,temperature.gpu \
        --format=csv || true
    python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, \
'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
}

print_profiles() {
    # The profiler summaries a run wrote (<output>/profile/rank*.summary.json, copied into $1): the GPU's busy
    # share and the top $2 operations of each rank.
    python3 - "$1" "${2:-12}" <<'PY'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("rank*.summary.json")):
    s = json.loads(path.read_text())
    print(path.name, "gpu_busy_share", s.get("gpu_busy_share"), "wall_s", s.get("wall_s"))
    for kind, row in (s.get("gpu_ms_per_step_by_kind") or {}).items():
        print(f"    {kind:<36} {row['ms_per_step']:8.2f} ms a step  {row['share']:6.1%}")
    for op in (s.get("top_gpu") or s.get("top_cpu") or [])[: int(sys.argv[2])]:
        print("   ", op)
PY
}

smollm2_target() {
    # ROOT: the SmolLM2 example's folder made from scratch on a device machine: the GGUF from its two carried
    # parts (/tmp/gguf/part1 from an earlier call, .carry2/gguf.part2), the prompt sets and any answers an earlier
    # lease wrote (.carry2/{prompts,data}/*.gz, /tmp/carried-data/*.gz), the target converted to a plain HF folder
    set -e
    local root=$1
    rm -rf "$root/target" "$root/prompts" "$root/data"
    mkdir -p "$root/prompts" "$root/data"
    cat /tmp/gguf/part1 .carry2/gguf.part2 >/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
    sha256sum /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
    for f in .carry2/prompts/*.gz; do zcat "$f" >"$root/prompts/$(basename "$f" .gz)"; done
    for f in .carry2/data/*.gz /tmp/carried-data/*.gz; do  # /tmp/carried-data: a stash call's (quality_h200.sh)
        [ -f "$f" ] || continue
        zcat "$f" >"$root/data/$(basename "$f" .gz)"
    done
    wc -l "$root"/prompts/*.jsonl "$root"/data/*.jsonl 2>/dev/null || true
    python3 -c "import sys; from pathlib import Path; from examples.smollm2.convert import convert_gguf
print(convert_gguf(Path('/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf'), Path(sys.argv[1]) / 'target').to_json())" "$root"
}

# `timeout` runs programs, not shell functions: stages call these through `bash -c`.
export SUITE_TINY SITE
export -f install_carried_wheels unzip_wheels gpu_facts smollm2_target

finish() {
    local tag=$1
    python3 - "$RES" "$OUT/results-$tag.json" <<'PY'
import json, pathlib, sys
results = {}
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    try:
        results[path.stem] = json.loads(path.read_text())
    except ValueError as exc:
        results[path.stem] = {"unreadable": str(exc), "head": path.read_text()[:2000]}
pathlib.Path(sys.argv[2]).write_text(json.dumps(results, indent=1, default=str))
print("merged", len(results), "result files into", sys.argv[2])
PY
    tar -czf "$OUT/logs-$tag.tar.gz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")" 2>/dev/null || true
    echo
    echo "==================== suite $tag: $(($(date +%s) - SUITE_START))s of ${SUITE_BUDGET_S}s"
    printf '%s\n' "${STAGE_LINES[@]}"
}
