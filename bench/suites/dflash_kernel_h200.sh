#!/usr/bin/env bash
# Issue 40 §3 on one H200 (~3 min): the DFlash-mask Triton kernel (bench/kernels/dflash_mask_kernel.py) against the
# trainer's compiled flex path at qwen3-8b-b16, then seed-b32, shapes (bench/kernels/dflash_attention.py:
# forward and backward timed apart, TFLOP/s on the mask's real pairs, output and q/k/v gradients held to flex's
# within 1e-2 relative), after the kernel's own GPU test (bf16 against exact SDPA).
#   run(kind="nvidia-h200", carry=[".whl"], timeout_s=330, command="bash bench/suites/dflash_kernel_h200.sh")
# Results: $OUT/results-dflash_kernel.json (one entry per recipe); the logs in $OUT/logs-dflash_kernel.tar.gz.
# CPU dry run of the plumbing (tiny shapes, Triton's interpreter, SDPA as the reference; needs triton in .venv):
#   SUITE_TINY=1 OUT=/tmp/x PATH=.venv/bin:$PATH bash bench/suites/dflash_kernel_h200.sh
set -u
cd "$(dirname "$0")/../.."
SUITE_BUDGET_S=${SUITE_BUDGET_S:-310}
source bench/lib/suite_lib.sh
stage setup 25 bash -c install_carried_wheels
[ -z "$SUITE_TINY" ] && stage facts 15 bash -c gpu_facts
stage gpu_test 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/bench/test_dflash_mask_kernel.py
stage b16 100 python3 -m bench.kernels.dflash_attention $TINY --config qwen3-8b-b16 \
    --json "$RES/dflash_attention-qwen3-8b-b16.json"
stage b32 150 python3 -m bench.kernels.dflash_attention $TINY --config seed-b32 \
    --json "$RES/dflash_attention-seed-b32.json"
finish dflash_kernel
