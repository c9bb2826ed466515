#!/usr/bin/env bash
# session 9 call 1: parity of next/window-prefetch (on next/store-slice-helper) + A/B of C128 decode
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$ROOT/python FLASHCOMPRESS_CACHE_DIR=/tmp/fc-cache
echo "== pytest test_gpu_compress (head $FC_COMMIT)"
timeout 220 python3 -m pytest tests/test_gpu_compress.py -m gpu -q -x -p no:cacheprovider > $OUT/pytest.log 2>&1; echo "rc=$?"; tail -3 $OUT/pytest.log
echo "t=$(( $(date +%s) - t0 ))"
echo "== sanitizer"
timeout 50 compute-sanitizer --tool memcheck python3 -m pytest tests/test_gpu_compress.py -m gpu -q -x -p no:cacheprovider -k "many_closing and most" > $OUT/san_memcheck.log 2>&1; echo "rc=$?"; grep -E "ERROR SUMMARY|passed|failed" $OUT/san_memcheck.log | tail -2
timeout 70 compute-sanitizer --tool racecheck python3 -m pytest tests/test_gpu_compress.py -m gpu -q -x -p no:cacheprovider -k "fused_matches and c128_ring128" > $OUT/san_racecheck.log 2>&1; echo "rc=$?"; grep -E "RACECHECK SUMMARY|passed|failed" $OUT/san_racecheck.log | tail -2
echo "t=$(( $(date +%s) - t0 ))"
echo "== A/B"
timeout $(( 570 - ($(date +%s) - t0) )) bash scripts/ab_bench.sh bench_pipeline.py --cases "decode-B1-rand:c128-512,decode-B128-rand:c128-512,decode-B512-rand:c128-512,decode-B512-bnd:c128-512,decode-B512-open*" --reps 20 2>&1 | tail -40
echo "t=$(( $(date +%s) - t0 ))"
