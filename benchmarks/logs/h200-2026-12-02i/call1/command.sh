#!/usr/bin/env bash
# session 12 call 1: HEAD cd7ef8e (C4 decode bulk stages, FC_DECODE_BULK=2): test_gpu_compress.py;
# A/B pipeline C4 decode: main (6200d40), bulk1 (bias at kernel start), bulk2st (+ bulk state store), head (bulk2).
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 FLASHCOMPRESS_CACHE_DIR=/tmp/fc-cache
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$ROOT/python
timeout 200 python3 -m pytest -m gpu -q tests/test_gpu_compress.py -p no:cacheprovider > /tmp/pytest.log 2>&1; echo "pytest compress rc=$?"
grep -E "^FAILED|passed|failed" /tmp/pytest.log | tail -8; cp /tmp/pytest.log $OUT/
echo "t=$(( $(date +%s) - t0 ))"
mkdir -p /tmp/aba
OUT=/tmp/aba FC_AB_DIR=$ROOT/.whl/aba timeout $(( 570 - ($(date +%s) - t0) )) bash scripts/ab_bench.sh bench_pipeline.py --cases "decode-B1-rand:c4-512,decode-B128-rand:c4-512,decode-B512-rand:c4-512,decode-B512-rand:c4-128,decode-B512-bnd:c4-512" --reps 15 2>&1 | tail -14
echo "t=$(( $(date +%s) - t0 ))"
cp /tmp/aba/*.md $OUT/ 2>/dev/null
