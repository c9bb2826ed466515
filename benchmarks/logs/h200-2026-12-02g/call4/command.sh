#!/usr/bin/env bash
# session 10 call 4: head = next/s10b c4baf39: racecheck on the 9-test subset (call 3's was cut by its timeout);
# A/B main vs head: bench_store (decode, prefill 32768), bench_pipeline (online decode, B1, prefill 8192).
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
t0=$(date +%s)
FINAL=$OUT; mkdir -p /tmp/gc
OUT=/tmp/gc FC_STEPS=prewarm,sanitizer FC_SANITIZER_TOOLS=racecheck \
FC_SANITIZER_TESTS="(golden and compress) or (fused_matches and (c4_paged_ring8 or c128_ring128 or c128_online))" \
  timeout 150 bash scripts/gpu_check.sh > /dev/null 2>&1; echo "gpu_check rc=$?"
cp /tmp/gc/gpu_check.log $FINAL/ 2>/dev/null
grep -E "^---|RACECHECK SUMMARY|ERROR SUMMARY|[0-9]+ (passed|failed)" /tmp/gc/gpu_check.log | tail -8
echo "t=$(( $(date +%s) - t0 ))"
export PYTHONPATH=/tmp/site:$ROOT/python
mkdir -p /tmp/abp /tmp/abs
OUT=/tmp/abs FC_AB_DIR=$ROOT/.whl/ab1 timeout 75 bash scripts/ab_bench.sh bench_store.py --cases "decode-B1-bnd,decode-B512-rand,prefill-32768" --reps 15 2>&1 | tail -14
echo "t=$(( $(date +%s) - t0 ))"
OUT=/tmp/abp FC_AB_DIR=$ROOT/.whl/ab1 timeout $(( 300 - ($(date +%s) - t0) )) bash scripts/ab_bench.sh bench_pipeline.py --cases "decode-B1-rand:c4-512,decode-B512-rand:c128-online,decode-B512-bnd:c128-online,prefill-8192:c4-512" --reps 15 2>&1 | tail -10
echo "t=$(( $(date +%s) - t0 ))"
tar czf $FINAL/ab.tgz -C /tmp abp abs 2>/dev/null
