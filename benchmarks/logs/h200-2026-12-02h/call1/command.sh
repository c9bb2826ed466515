#!/usr/bin/env bash
# session 11 call 1: HEAD = per-kernel PDL trigger (19730b6): test_gpu_store.py (launch helper, ratio check);
# ncu SourceCounters on fused decode B512 rand (online, C4 main, C128); A/B store (main, rows2, pf2, head);
# A/B pipeline decode (main vs head).
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 FLASHCOMPRESS_CACHE_DIR=/tmp/fc-cache
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$ROOT/python
timeout 150 python3 -m pytest -m gpu -q -x tests/test_gpu_store.py -p no:cacheprovider > /tmp/pytest.log 2>&1; echo "pytest store rc=$?"
tail -3 /tmp/pytest.log; cp /tmp/pytest.log $OUT/
echo "t=$(( $(date +%s) - t0 ))"
NCU="ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section SourceCounters --section LaunchStats --launch-count 1 --launch-skip 1"
cd benchmarks
for L in c128-online c4-512 c128-512; do
  timeout 70 $NCU -k regex:decode_kernel -o /tmp/ncu_$L python3 profile_case.py --op fused --case decode-B512-rand --layer $L --calls 2 > /tmp/ncu_$L.log 2>&1; echo "ncu $L rc=$?"
  ncu -i /tmp/ncu_$L.ncu-rep --print-details all > /tmp/ncu_$L.txt 2>&1
  ncu -i /tmp/ncu_$L.ncu-rep --page source --csv --print-source sass > /tmp/ncu_${L}_sass.csv 2>&1
  grep -E "Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|SM Active Cycles|Elapsed Cycles|Block Limit" /tmp/ncu_$L.txt | head -14
done
cd $ROOT
tar czf $OUT/ncu.tgz -C /tmp ncu_c128-online.txt ncu_c4-512.txt ncu_c128-512.txt ncu_c128-online_sass.csv ncu_c4-512_sass.csv ncu_c128-512_sass.csv ncu_c4-512.log
echo "t=$(( $(date +%s) - t0 ))"
mkdir -p /tmp/abs /tmp/abp
OUT=/tmp/abs FC_AB_DIR=$ROOT/.whl/abs timeout 200 bash scripts/ab_bench.sh bench_store.py --cases "decode-B512-rand,decode-B1-bnd,prefill-32768" --reps 15 2>&1 | tail -16
echo "t=$(( $(date +%s) - t0 ))"
OUT=/tmp/abp FC_AB_DIR=$ROOT/.whl/abp timeout $(( 560 - ($(date +%s) - t0) )) bash scripts/ab_bench.sh bench_pipeline.py --cases "decode-B128-rand:c4-512,decode-B512-rand:c4-512,decode-B512-rand:c4-128,decode-B512-rand:c128-512,decode-B512-rand:c128-online" --reps 15 2>&1 | tail -14
echo "t=$(( $(date +%s) - t0 ))"
tar czf $OUT/ab.tgz -C /tmp abp abs 2>/dev/null
