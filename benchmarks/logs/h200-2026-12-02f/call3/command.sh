#!/usr/bin/env bash
# session 9 call 3: full verification of next/cluster-stasync (head) + A/B vs main (97d9840), split (39a0cee), mbar (7b532d0)
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
t0=$(date +%s)
FINAL=$OUT; mkdir -p /tmp/gc
OUT=/tmp/gc FC_STEPS=prewarm,pytest,demo,sanitizer \
FC_SANITIZER_TESTS="(golden and compress) or (fused_matches and (c4_paged_ring8 or c128_ring128 or c128_online))" \
  timeout 330 bash scripts/gpu_check.sh > /dev/null 2>&1; echo "gpu_check rc=$?"
cp /tmp/gc/gpu_check.log /tmp/gc/summary.md $FINAL/ 2>/dev/null
grep -E "PASS|FAIL|SKIP" /tmp/gc/summary.md | head -12
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|[0-9]+ (passed|failed)" /tmp/gc/gpu_check.log | tail -8
echo "t=$(( $(date +%s) - t0 ))"
export PYTHONPATH=/tmp/site:$ROOT/python
OUT=$FINAL
echo "== A/B"
timeout $(( 585 - ($(date +%s) - t0) )) bash scripts/ab_bench.sh bench_pipeline.py --cases "decode-B1-rand:c128-512,decode-B512-rand:c128-512,decode-B512-bnd:c128-512,prefill-8192:c128*,prefill-32768:c128-512" --reps 15 2>&1 | tail -20
echo "t=$(( $(date +%s) - t0 ))"
