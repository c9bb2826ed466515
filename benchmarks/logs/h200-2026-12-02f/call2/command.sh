#!/usr/bin/env bash
# session 9 call 2: parity of next/split-barrier-s (store-slice-helper + split cluster barrier) + A/B vs main, slice + ncu of C128 open decode
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$ROOT/python FLASHCOMPRESS_CACHE_DIR=/tmp/fc-cache
echo "== pytest test_gpu_compress (head $FC_COMMIT)"
timeout 200 python3 -m pytest tests/test_gpu_compress.py -m gpu -q -x -p no:cacheprovider > $OUT/pytest.log 2>&1; echo "rc=$?"; grep -E "passed|failed|Error" $OUT/pytest.log | tail -3
echo "t=$(( $(date +%s) - t0 ))"
echo "== sanitizer"
S="python3 -m pytest tests/test_gpu_compress.py -m gpu -q -x -p no:cacheprovider"
{ timeout 25 compute-sanitizer --tool memcheck $S -k "many_closing and most"; echo "rc=$?";
  timeout 60 compute-sanitizer --tool racecheck $S -k "fused_matches and (c128_ring128 or c128_online)"; echo "rc=$?";
  timeout 45 compute-sanitizer --tool racecheck $S -k "many_closing and most"; echo "rc=$?"; } > $OUT/sanitizer.log 2>&1
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|^rc=" $OUT/sanitizer.log
echo "t=$(( $(date +%s) - t0 ))"
echo "== ncu open"
N="ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --launch-count 1"
timeout 45 $N -k regex:decode_kernel --launch-skip 1 python3 benchmarks/profile_case.py --op fused --case decode-B512-open --layer c128-512 --calls 2 > $OUT/ncu_open.log 2>&1
grep -E "Duration|DRAM Throughput|Achieved Occ|Warp Cycles Per Issued|SM Active Cycles|Elapsed Cycles|Grid Size|Waves" $OUT/ncu_open.log
echo "t=$(( $(date +%s) - t0 ))"
echo "== A/B"
timeout $(( 580 - ($(date +%s) - t0) )) bash scripts/ab_bench.sh bench_pipeline.py --cases "decode-B1-rand:c128-512,decode-B128-rand:c128-512,decode-B512-rand:c128-512,decode-B512-bnd:c128*,prefill-8192:c128*,prefill-32768:c128*" --reps 20 2>&1 | tail -30
echo "t=$(( $(date +%s) - t0 ))"
