#!/usr/bin/env bash
# session 11 call 2: HEAD aebf8e1 (trigger per kernel + online prior + warm params + lazy stage):
# test_gpu_compress.py + test_gpu_store.py; A/B pipeline decode (main, trig, nolazy, nowarm, head); A/B store (main, nowarm, head).
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 FLASHCOMPRESS_CACHE_DIR=/tmp/fc-cache
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$ROOT/python
timeout 200 python3 -m pytest -m gpu -q tests/test_gpu_compress.py tests/test_gpu_store.py -p no:cacheprovider > /tmp/pytest.log 2>&1; echo "pytest rc=$?"
grep -E "^FAILED|passed|failed" /tmp/pytest.log | tail -8; cp /tmp/pytest.log $OUT/
echo "t=$(( $(date +%s) - t0 ))"
mkdir -p /tmp/abs /tmp/abp
OUT=/tmp/abp FC_AB_DIR=$ROOT/.whl/abp timeout 260 bash scripts/ab_bench.sh bench_pipeline.py --cases "decode-B1-rand:c4-512,decode-B128-rand:c4-512,decode-B512-rand:c4-512,decode-B512-rand:c4-128,decode-B512-rand:c128-512,decode-B512-rand:c128-online,decode-B512-bnd:c128-online" --reps 15 2>&1 | tail -16
echo "t=$(( $(date +%s) - t0 ))"
OUT=/tmp/abs FC_AB_DIR=$ROOT/.whl/abs timeout $(( 570 - ($(date +%s) - t0) )) bash scripts/ab_bench.sh bench_store.py --cases "decode-B512-rand,decode-B1-bnd,prefill-32768" --reps 15 2>&1 | tail -14
echo "t=$(( $(date +%s) - t0 ))"
tar czf $OUT/ab.tgz -C /tmp abp abs 2>/dev/null
