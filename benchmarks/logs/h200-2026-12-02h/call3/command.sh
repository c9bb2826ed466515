#!/usr/bin/env bash
# session 11 call 3: HEAD 351087c: gpu_check prewarm,pytest,props,demo + memcheck on the 9-test subset;
# A/B online (novec = aebf8e1 without lazy stage vs head); A/B main vs head (pipeline decode + prefill, store).
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
t0=$(date +%s)
FINAL=$OUT; mkdir -p /tmp/gc
OUT=/tmp/gc FC_STEPS=prewarm,pytest,props,demo,sanitizer FC_SANITIZER_TOOLS=memcheck \
FC_SANITIZER_TESTS="(golden and compress) or (fused_matches and (c4_paged_ring8 or c128_ring128 or c128_online))" \
  timeout 330 bash scripts/gpu_check.sh > /dev/null 2>&1; echo "gpu_check rc=$?"
cp /tmp/gc/summary.md /tmp/gc/gpu_check.log $FINAL/ 2>/dev/null
grep -E "PASS|FAIL|SKIP" /tmp/gc/summary.md | head -8
grep -E "^FAILED|ERROR SUMMARY|[0-9]+ (passed|failed)" /tmp/gc/gpu_check.log | tail -12
echo "t=$(( $(date +%s) - t0 ))"
export PYTHONPATH=/tmp/site:$ROOT/python
mkdir -p /tmp/abo /tmp/abp /tmp/abs
OUT=/tmp/abo FC_AB_DIR=$ROOT/.whl/abo timeout 70 bash scripts/ab_bench.sh bench_pipeline.py --cases "decode-B512-rand:c128-online,decode-B512-bnd:c128-online,decode-B1-rand:c128-online" --reps 15 2>&1 | tail -7
echo "t=$(( $(date +%s) - t0 ))"
OUT=/tmp/abp FC_AB_DIR=$ROOT/.whl/abp timeout $(( 560 - ($(date +%s) - t0) )) bash scripts/ab_bench.sh bench_pipeline.py --cases "decode-B128-rand:c4-512,decode-B512-rand:c4-512,decode-B512-rand:c4-128,decode-B512-rand:c128-512,prefill-8192:c4-512" --reps 15 2>&1 | tail -12
echo "t=$(( $(date +%s) - t0 ))"
tar czf $FINAL/ab.tgz -C /tmp abo abp 2>/dev/null
