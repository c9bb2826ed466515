set -o pipefail
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 FC_COMMIT=54b7d0d
t0=$(date +%s)
FC_STEPS=props,demo,sanitizer FC_SANITIZER_TESTS="golden or (fused_matches and (c4_paged_ring8 or c4_bf16_state_bf16_store or c128_ring128 or c128_online))" timeout 240 bash scripts/gpu_check.sh > /dev/null 2>&1; echo "gpu_check rc=$?"
cat $OUT/summary.md | grep -E "^\|" | head -8
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" $OUT/gpu_check.log | tail -10
echo "checks done at $(( $(date +%s) - t0 )) s"
export PYTHONPATH=/tmp/site:$PWD/python FLASHCOMPRESS_CACHE_DIR=/tmp/fc-cache
for spec in "decode-B128-rand c4-512"; do set -- $spec
timeout 90 ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats -k regex:decode_kernel --launch-skip 1 --launch-count 1 python3 benchmarks/profile_case.py --op fused --case $1 --layer $2 --calls 3 > $OUT/ncu_$1_$2.log 2>&1; echo "ncu $1 $2 rc=$?"
grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Stall|Waves Per SM|Block Limit" $OUT/ncu_$1_$2.log | head -14
done
echo "all done at $(( $(date +%s) - t0 )) s"
