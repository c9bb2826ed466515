#!/usr/bin/env bash
# session 7 call 3: final verification of HEAD (kernels of 8685400) + the cases call 2 did not time + ncu
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
FC_COMMIT=${FC_COMMIT:-unknown} FC_STEPS=prewarm,pytest,props,demo,sanitizer \
FC_SANITIZER_TESTS="(golden and compress) or (fused_matches and (c4_paged_ring8 or c128_ring128 or c128_online))" \
  timeout 420 bash scripts/gpu_check.sh > /dev/null 2>&1
grep -E "PASS|FAIL|SKIP|passed|failed" $OUT/summary.md | head -20
tail -3 $OUT/gpu_check.log
export PYTHONPATH=/tmp/site:$ROOT/python
echo "== bench (head)"
timeout 75 python3 benchmarks/bench_pipeline.py --cases "prefill-8192" --reps 20 --md $OUT/bench_pipeline.md 2>/dev/null | tail -22
timeout 30 python3 benchmarks/bench_store.py --cases "prefill-32768" --reps 20 --md $OUT/bench_store.md 2>/dev/null | tail -6
echo "== ncu"
N="ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --launch-count 1"
timeout 25 $N -k regex:decode_kernel --launch-skip 1 python3 benchmarks/profile_case.py --op fused --case decode-B512-bnd --layer c128-512 --calls 2 > $OUT/ncu_c128_bnd.log 2>&1
timeout 25 $N -k regex:prefill_kernel --launch-skip 1 python3 benchmarks/profile_case.py --op fused --case prefill-32768 --layer c128-512 --calls 2 > $OUT/ncu_c128_prefill.log 2>&1
timeout 25 $N -k regex:decode_kernel --launch-skip 1 python3 benchmarks/profile_case.py --op fused --case decode-B128-rand --layer c4-512 --calls 3 > $OUT/ncu_c4_b128.log 2>&1
for f in $OUT/ncu_*.log; do echo "-- $f"; grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occ|Warp Cycles Per Issued" $f; done
