#!/usr/bin/env bash
# Two "nodes" on one CPU machine: two `dflash-doctor train` launchers of tiny-cpu-2t1d (2 targets + 1 drafter
# each, gloo), started together, meeting at 127.0.0.1:PORT. What tests/launch/test_multinode.py runs; about a
# minute on a 2-core box (BENCHMARKS 4.11). Each node gets its own home and output folder, as separate machines
# would; node 0's folder holds the run's metrics, checkpoints and export (its rank 2 is the first drafter).
#
#   bash examples/multinode/cpu_two_nodes.sh            # from the repository root, with the venv made
#   DIR=/tmp/two-nodes STEPS=40 bash examples/multinode/cpu_two_nodes.sh
set -euo pipefail

DIR=${DIR:-$(mktemp -d -t dflash-two-nodes-XXXX)}
STEPS=${STEPS:-6}
DFLASH_DOCTOR=${DFLASH_DOCTOR:-.venv/bin/dflash-doctor}
PORT=${PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
SHORT=(--set optim.steps="$STEPS" --set data.seq_len=64 --set data.num_samples=64 --set optim.batch_size=4
       --set optim.anchors=16 --set run.log_every=1 --set drafter.compile_loss=false)

pids=()
for NODE in 0 1; do
  DFLASH_DOCTOR_HOME="$DIR/home$NODE" "$DFLASH_DOCTOR" train --config tiny-cpu-2t1d \
    --nnodes 2 --node-rank "$NODE" --rdzv-endpoint "127.0.0.1:$PORT" \
    "${SHORT[@]}" --set "output.dir='$DIR/out$NODE'" > "$DIR/node$NODE.log" 2>&1 &
  pids+=($!)
done

status=0
for NODE in 0 1; do
  if wait "${pids[$NODE]}"; then code=0; else code=$?; status=1; fi
  echo "node $NODE: exit $code (log: $DIR/node$NODE.log)"
done
echo "metrics: $DIR/out0/metrics.jsonl; summary: $DIR/out0/summary.json"
exit $status
