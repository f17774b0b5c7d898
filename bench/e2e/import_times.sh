#!/usr/bin/env bash
# Where the launcher's and the workers' start-up seconds go on this machine (issue 7: time to first step).
# Fresh interpreters, each timed twice (the second with warm file caches); -X importtime tables and a cProfile
# of `train --dry-run --no-deep` land in $OUT (IMPORT_QUICK=1: only the timed lines; IMPORT_ROUNDS=1: each once;
# IMPORT_TAG=x names the file import_times-x.txt). On the GPU machine:
#   run(kind="nvidia-h200", carry=[".whl"], command="bash bench/e2e/import_times.sh")
# Here: OUT=/tmp/imports PATH=.venv/bin:$PATH SUITE_TINY=1 bash bench/e2e/import_times.sh
set -u
cd "$(dirname "$0")/../.."
source bench/lib/suite_lib.sh
stage setup 25 bash -c install_carried_wheels
CONFIG=${IMPORT_CONFIG:-qwen3-8b-b16}
[ -n "$SUITE_TINY" ] && CONFIG=tiny-cpu
TAG=${IMPORT_TAG:+-$IMPORT_TAG}  # IMPORT_TAG=after: a second measurement beside the first
timed() {  # LABEL PYTHON-CODE
    for round in $(seq "${IMPORT_ROUNDS:-2}"); do
        python3 -c "import time; t = time.perf_counter(); $2; print('$1 (round $round): %.2f s' % (time.perf_counter() - t))"
    done
}
{
    timed "import torch" "import torch"
    timed "import transformers.Qwen3Config" "from transformers import Qwen3Config"
    timed "gate: load_training_config" "from dflash_doctor.launch.gate import load_training_config; load_training_config('$CONFIG')"
    timed "import trainer.run.train (a worker)" "import trainer.run.train"
    timed "import torch._dynamo + inductor" "import torch, torch._dynamo, torch._inductor.compile_fx"
} 2>&1 | tee "$OUT/import_times$TAG.txt"
[ -n "${IMPORT_QUICK:-}" ] && exit 0  # IMPORT_QUICK=1: the timed lines only
python3 -X importtime -c "import trainer.run.train" 2> "$OUT/importtime-worker.txt"
python3 -X importtime -c "from dflash_doctor.launch.gate import load_training_config; load_training_config('$CONFIG')" \
    2> "$OUT/importtime-gate.txt"
python3 -m cProfile -o /tmp/gate.prof -m dflash_doctor train --config "$CONFIG" --dry-run --no-deep > /dev/null 2>&1
python3 - <<'PY' | tee "$OUT/gate-profile.txt"
import io, pstats
stream = io.StringIO()
pstats.Stats("/tmp/gate.prof", stream=stream).sort_stats("cumulative").print_stats(60)
print(stream.getvalue())
PY
for f in "$OUT"/importtime-*.txt; do echo "== slowest in $f"; sort -t'|' -k2 -n "$f" | tail -n 25; done
