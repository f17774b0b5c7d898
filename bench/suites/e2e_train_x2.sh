#!/usr/bin/env bash
# 1 target + 1 drafter end to end on 2 H200s through `dflash-doctor train` itself (gate, cache warm from
# empty, torchrun, NCCL transport), with per-GPU memory sampled by nvidia-smi. Everything lands in $OUT:
# train.log, metrics.jsonl, summary.json, record.json, gpu_mem.csv, and the cache snapshot when small.
#   run(kind="nvidia-h200-x2", carry=[".whl"], command="bash bench/suites/e2e_train_x2.sh")
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/e2e-out}
STEPS=${STEPS:-30}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DFLASH_DOCTOR_HOME=/tmp/ddhome
nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/gpu_mem.csv" &
SMI=$!
start=$(date +%s)
timeout -k 10 "${LIMIT_S:-500}" python3 -m dflash_doctor train --force --config trainer/configs/qwen3-8b-b16.toml \
    --set "optim.steps=$STEPS" --set checkpoint.every=0 --set "output.dir='/tmp/e2e-run'" 2>&1 | tee "$OUT/train.log" | grep -v "^DEBUG"
echo "train exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s"
kill $SMI
cp /tmp/e2e-run/metrics.jsonl /tmp/e2e-run/summary.json "$OUT/" 2>/dev/null
cp "$(ls -t /tmp/ddhome/state/runs/*/record.json | head -1)" "$OUT/record.json" 2>/dev/null
snap=$(ls -t /tmp/ddhome/cache/snapshots/* 2>/dev/null | head -1)
[ -n "$snap" ] && ls -la "$snap" && [ "$(stat -c %s "$snap")" -lt 16000000 ] && cp "$snap" "$OUT/"
python3 - "$OUT" <<'PY'
import csv, json, sys
out = sys.argv[1]
peaks = {}
for row in csv.reader(open(f"{out}/gpu_mem.csv")):
    if len(row) == 3:
        peaks[row[1].strip()] = max(peaks.get(row[1].strip(), 0), int(row[2]))
lines = [json.loads(l) for l in open(f"{out}/metrics.jsonl")] if __import__("os").path.exists(f"{out}/metrics.jsonl") else []
steady = lines[5:] or lines
tok = sorted(l.get("tok_s", 0) for l in steady)
wait = [l.get("data_wait_s", 0) for l in steady]
step = [l.get("step_time_s", 0) for l in steady]
print(json.dumps({"gpu_peak_mib": peaks, "steps": len(lines), "median_tok_s": tok[len(tok)//2] if tok else None,
                  "wait_fraction": (sum(wait) / sum(step)) if step and sum(step) else None,
                  "keys": sorted(lines[0]) if lines else []}, indent=1))
PY
