#!/usr/bin/env bash
# session 7 call 1: staged prefill (3e89ca7) parity + A/B vs fc1e206
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site
T=/tmp/staged-tree; rm -rf $T; mkdir -p $T
cp -r python templates tests benchmarks scripts pyproject.toml .cache-config.toml $T/
cp -r .whl/ab/staged $T/jit_kernel
cd $T
export FLASHCOMPRESS_CACHE_DIR=/tmp/fc-cache-staged
echo "== pytest gpu (staged tree)"
timeout 300 env PYTHONPATH=/tmp/site:$T/python python3 -m pytest tests/test_gpu_compress.py tests/test_compile.py -m gpu -q -x 2>&1 | tail -15 | tee $OUT/pytest.log
echo "== sanitizer"
for tool in memcheck racecheck; do
timeout 150 env PYTHONPATH=/tmp/site:$T/python compute-sanitizer --tool $tool --print-limit 5 python3 -m pytest tests/test_gpu_compress.py -m gpu -q -x -k "fused_matches and (c4_paged_ring8 or c128_ring128 or c128_online)" 2>&1 | tail -6 | tee $OUT/san_$tool.log
done
echo "== ncu"
timeout 90 env PYTHONPATH=/tmp/site:$T/python ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats -k regex:prefill_staged --launch-skip 1 --launch-count 1 python3 benchmarks/profile_case.py --op fused --case prefill-32768 --layer c128-512 --calls 2 > $OUT/ncu_c128.log 2>&1
grep -E "Duration|DRAM Throughput|Registers|Achieved Occ|Warp Cycles Per Issued|Grid Size|Dynamic Shared" $OUT/ncu_c128.log
cd $ROOT
echo "== A/B"
timeout 240 bash scripts/ab_bench.sh bench_pipeline.py --cases prefill --reps 20 2>&1 | tail -40
