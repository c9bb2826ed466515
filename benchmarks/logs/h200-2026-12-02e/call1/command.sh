#!/usr/bin/env bash
# session 8 call 1: next/s8 (= main + next/running-fold + next/store-cvt) parity; A/B base (main) / rf / cvt / head (both)
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$ROOT/python
echo "== pytest gpu compress+store (head)"
timeout 250 python3 -m pytest tests/test_gpu_compress.py tests/test_gpu_store.py -m gpu -q -x -p no:cacheprovider 2>&1 | tail -15 > $OUT/pytest.log; tail -3 $OUT/pytest.log
echo "t=$(( $(date +%s) - t0 ))"
echo "== A/B pipeline"
timeout 270 bash scripts/ab_bench.sh bench_pipeline.py --cases "decode-B128-rand,decode-B512-bnd,prefill-32768" --reps 15 2>&1 | tail -32
echo "t=$(( $(date +%s) - t0 ))"
mkdir -p $OUT/pipe && mv $OUT/ab_*.md $OUT/ab_*.log $OUT/pipe/ 2>/dev/null
echo "== A/B store (base vs head)"
mkdir -p /tmp/abs && cp -r .whl/ab/base /tmp/abs/
FC_AB_DIR=/tmp/abs timeout $(( 570 - ($(date +%s) - t0) )) bash scripts/ab_bench.sh bench_store.py --cases "prefill-32768" --reps 15 2>&1 | tail -14
echo "t=$(( $(date +%s) - t0 ))"
