#!/usr/bin/env bash
# session 8 call 3: final verification of main e1371ac (session 7 kernels + store-cvt; host-path trim; B = 2600 test) + host overhead + tables
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
t0=$(date +%s)
FC_COMMIT=e1371ac FC_STEPS=prewarm,pytest,props,demo,sanitizer \
FC_SANITIZER_TESTS="(golden and compress) or (fused_matches and (c4_paged_ring8 or c128_ring128 or c128_online))" \
  timeout 400 bash scripts/gpu_check.sh > /dev/null 2>&1
grep -E "PASS|FAIL|SKIP" $OUT/summary.md | head -12
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|[0-9]+ (passed|failed)" $OUT/gpu_check.log | tail -8
echo "t=$(( $(date +%s) - t0 ))"
export PYTHONPATH=/tmp/site:$ROOT/python FLASHCOMPRESS_CACHE_DIR=/tmp/fc-cache
echo "== host overhead"
timeout 60 python3 benchmarks/bench_host_overhead.py --device cuda --batch 64 > $OUT/host_overhead.txt 2>&1; tail -14 $OUT/host_overhead.txt
echo "t=$(( $(date +%s) - t0 ))"
echo "== bench"
timeout $(( 540 - ($(date +%s) - t0) )) python3 benchmarks/bench_pipeline.py --cases "decode-B512-rand,prefill-8192" --reps 20 --md $OUT/bench_pipeline.md 2>/dev/null | grep -E "fused|two-step" | head -20
echo "t=$(( $(date +%s) - t0 ))"
