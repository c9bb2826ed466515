#!/usr/bin/env bash
# session 8 call 2: next/plan-stage (main + C128 decode plan rows staged 32 at a time): gpu_check (prewarm, pytest -m gpu, sanitizer) + decode A/B vs main + ncu C128 B512 rand
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
t0=$(date +%s)
FC_COMMIT=f3543f9 FC_STEPS=prewarm,pytest,sanitizer \
FC_SANITIZER_TESTS="(golden and compress) or (fused_matches and (c4_paged_ring8 or c128_ring128 or c128_online)) or (many_closing and quarter)" \
  timeout 330 bash scripts/gpu_check.sh > /dev/null 2>&1
grep -E "PASS|FAIL|SKIP|passed|failed" $OUT/summary.md | head -12
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|[0-9]+ (passed|failed)" $OUT/gpu_check.log | tail -8
echo "t=$(( $(date +%s) - t0 ))"
echo "== A/B decode"
timeout 200 bash scripts/ab_bench.sh bench_pipeline.py --cases "decode-B1-rand,decode-B128-rand,decode-B512-rand,decode-B512-bnd" --reps 20 2>&1 | grep -E "c128|exit" 
echo "t=$(( $(date +%s) - t0 ))"
export PYTHONPATH=/tmp/site:$ROOT/python FLASHCOMPRESS_CACHE_DIR=/tmp/ab-cache-head
N="ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --launch-count 1"
timeout 40 $N -k regex:decode_kernel --launch-skip 1 python3 benchmarks/profile_case.py --op fused --case decode-B512-rand --layer c128-512 --calls 2 > $OUT/ncu_c128_rand.log 2>&1
grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occ|Warp Cycles Per Issued" $OUT/ncu_c128_rand.log
echo "t=$(( $(date +%s) - t0 ))"
