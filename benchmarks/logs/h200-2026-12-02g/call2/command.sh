#!/usr/bin/env bash
# session 10 call 2: head = next/s10 44fdb18 (store-lean + loop-loads + PDL launches): prewarm + pytest -m gpu;
# A/B bench_pipeline (main, s10 = lean + loop-loads f27ebd5, head) and bench_store (main, head).
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
t0=$(date +%s)
FINAL=$OUT; mkdir -p /tmp/gc
OUT=/tmp/gc FC_STEPS=prewarm,pytest timeout 230 bash scripts/gpu_check.sh > /dev/null 2>&1; echo "gpu_check rc=$?"
cp /tmp/gc/gpu_check.log $FINAL/gpu_check.log 2>/dev/null
grep -E "PASS|FAIL|SKIP" /tmp/gc/summary.md | head -8
grep -E "^FAILED|^ERROR|[0-9]+ (passed|failed)" /tmp/gc/gpu_check.log | tail -12
echo "t=$(( $(date +%s) - t0 ))"
export PYTHONPATH=/tmp/site:$ROOT/python
mkdir -p /tmp/abp /tmp/abs
echo "== A/B pipeline"
OUT=/tmp/abp FC_AB_DIR=$ROOT/.whl/ab2 timeout $(( 560 - ($(date +%s) - t0) - 80 )) bash scripts/ab_bench.sh bench_pipeline.py --cases "decode-B1-rand:c4-512,decode-B128-rand:c4-512,decode-B512-rand:c4*,decode-B512-rand:c128*,decode-B512-open:c128-512,decode-B512-bnd:c128-512,prefill-8192:c4-512" --reps 15 2>&1 | tail -40
echo "t=$(( $(date +%s) - t0 ))"
echo "== A/B store"
OUT=/tmp/abs FC_AB_DIR=$ROOT/.whl/ab1 timeout $(( 585 - ($(date +%s) - t0) )) bash scripts/ab_bench.sh bench_store.py --cases "decode-B1-bnd,decode-B512-rand,prefill-32768" --reps 15 2>&1 | tail -16
echo "t=$(( $(date +%s) - t0 ))"
tar czf $FINAL/ab.tgz -C /tmp abp abs gc/summary.md 2>/dev/null
