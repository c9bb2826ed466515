#!/usr/bin/env bash
# session 7 call 2: HEAD (instruction diet in compress.cuh + pipelined standalone store) vs fc1e206
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$ROOT/python
echo "== pytest gpu (head)"
timeout 240 python3 -m pytest tests/test_gpu_compress.py tests/test_gpu_store.py -m gpu -q -x 2>&1 | tail -4 | tee $OUT/pytest.log
echo "== A/B store"
FC_AB_DIR=.whl/ab-store timeout 150 bash scripts/ab_bench.sh bench_store.py --cases "prefill-32768,decode-B512-rand" --reps 20 2>&1 | tail -14
mkdir -p $OUT/store && mv $OUT/ab_*.md $OUT/ab_*.log $OUT/store/ 2>/dev/null
echo "== A/B pipeline"
timeout 170 bash scripts/ab_bench.sh bench_pipeline.py --cases "decode-B128-rand,decode-B512-rand,decode-B512-bnd,prefill-32768" --reps 20 2>&1 | tail -36
