#!/usr/bin/env bash
# session 10 call 3: head = next/s10b c4baf39 (store-lean + PDL, trigger after the work): full verification;
# A/B bench_pipeline + bench_store: main, entry (trigger right after the wait), head.
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
t0=$(date +%s)
FINAL=$OUT; mkdir -p /tmp/gc
OUT=/tmp/gc FC_STEPS=prewarm,pytest,props,demo,sanitizer \
FC_SANITIZER_TESTS="(golden and compress) or (fused_matches and (c4_paged_ring8 or c128_ring128 or c128_online))" \
  timeout 340 bash scripts/gpu_check.sh > /dev/null 2>&1; echo "gpu_check rc=$?"
cp /tmp/gc/gpu_check.log /tmp/gc/summary.md $FINAL/ 2>/dev/null
grep -E "PASS|FAIL|SKIP" /tmp/gc/summary.md | head -12
grep -E "^FAILED|ERROR SUMMARY|RACECHECK SUMMARY|[0-9]+ (passed|failed)" /tmp/gc/gpu_check.log | tail -10
echo "t=$(( $(date +%s) - t0 ))"
export PYTHONPATH=/tmp/site:$ROOT/python
mkdir -p /tmp/abp /tmp/abs
echo "== A/B store"
OUT=/tmp/abs FC_AB_DIR=$ROOT/.whl/ab1 timeout 70 bash scripts/ab_bench.sh bench_store.py --cases "decode-B1-bnd,decode-B512-rand,prefill-32768" --reps 15 2>&1 | tail -14
echo "t=$(( $(date +%s) - t0 ))"
echo "== A/B pipeline"
OUT=/tmp/abp FC_AB_DIR=$ROOT/.whl/ab1 timeout $(( 575 - ($(date +%s) - t0) )) bash scripts/ab_bench.sh bench_pipeline.py --cases "decode-B1-rand:c4-512,decode-B128-rand:c4-512,decode-B512-rand:c4-128,decode-B512-rand:c128*,prefill-8192:c4-512" --reps 15 2>&1 | tail -16
echo "t=$(( $(date +%s) - t0 ))"
tar czf $FINAL/ab.tgz -C /tmp abp abs 2>/dev/null
