#!/usr/bin/env bash
# session 12 call 3: the cluster-free C128 tiling (HIP / CUDA < sm_90) run on the H200 by forcing it
# (tree .whl/abn/nocl = 42f3134 with FC_FORCE_NO_CLUSTERS=1): test_gpu_compress.py, test_properties.py
# (CUDA), memcheck on the fused C128 tests; A/B speed nocl vs head (C128 layers).
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
T=/tmp/nocl; rm -rf $T; mkdir -p $T
cp -r python templates benchmarks tests pyproject.toml .cache-config.toml $T/ && cp -r .whl/abn/nocl $T/jit_kernel
grep -n "^#define FC_FORCE_NO_CLUSTERS" $T/jit_kernel/compress.cuh
cd $T
export PYTHONPATH=/tmp/site:$T/python FLASHCOMPRESS_CACHE_DIR=/tmp/fc-nocl
timeout 210 python3 -m pytest -m gpu -q tests/test_gpu_compress.py -p no:cacheprovider > $OUT/nocl_pytest.log 2>&1; echo "nocl pytest compress rc=$?"
grep -E "^FAILED|passed|failed" $OUT/nocl_pytest.log | tail -8
echo "t=$(( $(date +%s) - t0 ))"
FLASHCOMPRESS_TEST_DEVICE=cuda timeout 60 python3 -m pytest tests/test_properties.py -q -p no:cacheprovider > $OUT/nocl_props.log 2>&1; echo "nocl props rc=$?"
tail -2 $OUT/nocl_props.log
echo "t=$(( $(date +%s) - t0 ))"
timeout 90 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -m gpu -q tests/test_gpu_compress.py -p no:cacheprovider \
  -k "fused_matches and (c128_ring128 or c128_online)" > /tmp/nocl_memcheck.log 2>&1; echo "nocl memcheck rc=$?"
grep -E "ERROR SUMMARY|passed|failed" /tmp/nocl_memcheck.log | tail -3; tail -30 /tmp/nocl_memcheck.log > $OUT/nocl_memcheck_tail.log
echo "t=$(( $(date +%s) - t0 ))"
cd $ROOT
export PYTHONPATH=/tmp/site:$ROOT/python; unset FLASHCOMPRESS_CACHE_DIR
mkdir -p /tmp/abn
OUT=/tmp/abn FC_AB_DIR=$ROOT/.whl/abn timeout $(( 570 - ($(date +%s) - t0) )) bash scripts/ab_bench.sh bench_pipeline.py --cases "decode-B1-rand:c128,decode-B512-rand:c128,prefill-8192:c128" --reps 15 2>&1 | tail -14
echo "t=$(( $(date +%s) - t0 ))"
cp /tmp/abn/*.md $OUT/ 2>/dev/null
