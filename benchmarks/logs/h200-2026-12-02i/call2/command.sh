#!/usr/bin/env bash
# session 12 call 2: HEAD (main's kernels + the PLAN_EARLY knob at 0): gpu_check pytest (every GPU file) + props;
# A/B pipeline decode: head vs early (FC_DECODE_PLAN_EARLY=1: first plan row read before griddepcontrol.wait).
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
t0=$(date +%s)
FINAL=$OUT; mkdir -p /tmp/gc
OUT=/tmp/gc FC_STEPS=pytest,props timeout 260 bash scripts/gpu_check.sh > /dev/null 2>&1; echo "gpu_check rc=$?"
cp /tmp/gc/summary.md /tmp/gc/gpu_check.log $FINAL/ 2>/dev/null
grep -E "PASS|FAIL|SKIP" /tmp/gc/summary.md | head -8
grep -E "^FAILED|ERROR SUMMARY|[0-9]+ (passed|failed)" /tmp/gc/gpu_check.log | tail -12
echo "t=$(( $(date +%s) - t0 ))"
export PYTHONPATH=/tmp/site:$ROOT/python
mkdir -p /tmp/abb
OUT=/tmp/abb FC_AB_DIR=$ROOT/.whl/abb timeout $(( 570 - ($(date +%s) - t0) )) bash scripts/ab_bench.sh bench_pipeline.py --cases "decode-B128-rand:c4-512,decode-B512-rand:c4-512,decode-B512-rand:c4-128,decode-B512-rand:c128-512,decode-B512-rand:c128-online" --reps 15 2>&1 | tail -12
echo "t=$(( $(date +%s) - t0 ))"
cp /tmp/abb/*.md $FINAL/ 2>/dev/null
