#!/usr/bin/env bash
# session 10 call 1: head = next/s10 (store-lean ee85518 + loop-loads): prewarm + pytest -m gpu;
# A/B bench_store (main vs head); ncu source-level on the store kernel and the fused C4 decode.
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
t0=$(date +%s)
FINAL=$OUT; mkdir -p /tmp/gc
OUT=/tmp/gc FC_STEPS=prewarm,pytest timeout 260 bash scripts/gpu_check.sh > /dev/null 2>&1; echo "gpu_check rc=$?"
cp /tmp/gc/summary.md $FINAL/ 2>/dev/null; cp /tmp/gc/gpu_check.log $FINAL/gpu_check.log 2>/dev/null
grep -E "PASS|FAIL|SKIP" /tmp/gc/summary.md | head -8
grep -E "^FAILED|[0-9]+ (passed|failed)" /tmp/gc/gpu_check.log | tail -12
echo "t=$(( $(date +%s) - t0 ))"
export PYTHONPATH=/tmp/site:$ROOT/python
OUT=$FINAL
echo "== A/B store"
FC_AB_DIR=$ROOT/.whl/ab1 timeout 150 bash scripts/ab_bench.sh bench_store.py --cases "decode-B1-bnd,decode-B512-rand,decode-B512-bnd,prefill-32768" --reps 20 2>&1 | tail -22
echo "t=$(( $(date +%s) - t0 ))"
NCU="ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section SourceCounters --section LaunchStats --launch-count 1 --launch-skip 1"
cd benchmarks
timeout 60 $NCU -k regex:store_kernel -o /tmp/ncu_store python3 profile_case.py --op store --case prefill-32768 --layer c4-512 --calls 2 > /tmp/ncu1.log 2>&1; echo "ncu store rc=$?"
timeout 60 $NCU -k regex:decode_kernel -o /tmp/ncu_c4dec python3 profile_case.py --op fused --case decode-B128-rand --layer c4-512 --calls 2 > /tmp/ncu2.log 2>&1; echo "ncu c4 rc=$?"
for n in store c4dec; do
  ncu -i /tmp/ncu_$n.ncu-rep --print-details all > /tmp/ncu_$n.txt 2>&1
  ncu -i /tmp/ncu_$n.ncu-rep --page source --csv --print-source sass > /tmp/ncu_${n}_sass.csv 2>&1
  echo "$n: $(wc -l < /tmp/ncu_${n}_sass.csv) csv lines"
done
cat /tmp/ncu_store.txt /tmp/ncu_c4dec.txt > $OUT/ncu_details.txt
tar czf $OUT/ncu_sass.tgz -C /tmp ncu_store_sass.csv ncu_c4dec_sass.csv ncu1.log ncu2.log
grep -E "Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issued Ipc|SM Active Cycles|Elapsed Cycles" $OUT/ncu_details.txt | head -30
echo "t=$(( $(date +%s) - t0 ))"
