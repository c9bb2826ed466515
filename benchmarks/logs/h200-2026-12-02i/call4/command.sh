#!/usr/bin/env bash
# session 12 call 4: HEAD a39e67e: gpu_check pytest (every GPU file), demo, racecheck on the 9-test subset;
# A/B C128 decode grid: one wave of resident clusters (head) vs 4 and 16 waves (fewer requests per team).
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
t0=$(date +%s)
FINAL=$OUT; mkdir -p /tmp/gc
OUT=/tmp/gc FC_STEPS=pytest,demo,sanitizer FC_SANITIZER_TOOLS=racecheck \
FC_SANITIZER_TESTS="(golden and compress) or (fused_matches and (c4_paged_ring8 or c128_ring128 or c128_online))" \
  timeout 330 bash scripts/gpu_check.sh > /dev/null 2>&1; echo "gpu_check rc=$?"
cp /tmp/gc/summary.md /tmp/gc/gpu_check.log $FINAL/ 2>/dev/null
grep -E "PASS|FAIL|SKIP" /tmp/gc/summary.md | head -8
grep -E "^FAILED|ERROR SUMMARY|RACECHECK SUMMARY|[0-9]+ (passed|failed)" /tmp/gc/gpu_check.log | tail -12
echo "t=$(( $(date +%s) - t0 ))"
export PYTHONPATH=/tmp/site:$ROOT/python
mkdir -p /tmp/abw
OUT=/tmp/abw FC_AB_DIR=$ROOT/.whl/abw timeout $(( 575 - ($(date +%s) - t0) )) bash scripts/ab_bench.sh bench_pipeline.py --cases "decode-B1-rand:c128-512,decode-B128-rand:c128-512,decode-B512-rand:c128-512,decode-B512-bnd:c128-512" --reps 15 2>&1 | tail -10
echo "t=$(( $(date +%s) - t0 ))"
cp /tmp/abw/*.md $FINAL/ 2>/dev/null
