#!/usr/bin/env bash
# SIGTERM, then SIGINT, to a real `dflash-doctor train --config qwen3-8b-b16` on 2 H200s (1 target + 1
# drafter, NCCL) after its first steps: exit 128+signal, no process left (the launcher's whole tree and
# nvidia-smi's compute apps), the record `interrupted` with its last metrics (bench/e2e/interrupt.py).
# The first launch compiles cold (minutes); the second reuses the warm cache.
#   run(kind="nvidia-h200-x2", carry=[".whl"], command="bash bench/suites/interrupt_x2.sh")
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/interrupt-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DFLASH_DOCTOR_HOME=/tmp/ddhome
timeout -k 10 "${LIMIT_S:-580}" python3 -m bench.e2e.interrupt --config qwen3-8b-b16 --signals TERM,INT \
    --steps-first 3 --set checkpoint.every=0 --limit-s 420 --json "$OUT/interrupt-x2.json"
echo "interrupt exit $?"
nvidia-smi --query-compute-apps=pid,process_name --format=csv
