#!/usr/bin/env bash
# One-shot GPU session: build, parity tests, benchmarks.  Run on the lent H200 through the
# device tool from the repo root, carrying the apache-tvm-ffi cp312 wheel in .whl/:
#
#   run(command="bash scripts/gpu_check.sh", carry=[".whl"])
#
# Everything it prints also lands in $OUT (default ./gpu-out) as separate logs.
set -uo pipefail
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"

# tvm-ffi is not on the device image: install the carried wheel into a private site dir.
if ! python3 -c "import tvm_ffi" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "tvm-ffi wheel install failed"; exit 1; }
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
# The package itself runs from the source tree (no network there for an install).
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export FLASHCOMPRESS_CACHE_DIR="${FLASHCOMPRESS_CACHE_DIR:-/tmp/fc-cache}"

step() { echo; echo "=== $1 ($(date -u +%H:%M:%S))"; }

step "environment" | tee "$OUT/env.log"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch, tvm_ffi; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'tvm_ffi', tvm_ffi.__version__)"; nvcc --version | tail -1; git log --oneline -1 2>/dev/null || true; } 2>&1 | tee -a "$OUT/env.log"

step "prewarm deepseek-v4-flash (cold)" | tee "$OUT/prewarm.log"
/usr/bin/time -f "prewarm wall %e s" python3 -m flashcompress prewarm --model deepseek-v4-flash 2>&1 | tee -a "$OUT/prewarm.log"
step "prewarm deepseek-v4-flash (warm: must compile nothing)" | tee -a "$OUT/prewarm.log"
/usr/bin/time -f "prewarm wall %e s" python3 -m flashcompress prewarm --model deepseek-v4-flash 2>&1 | tee -a "$OUT/prewarm.log"

step "GPU parity tests (pytest -m gpu)" | tee "$OUT/pytest_gpu.log"
python3 -m pytest tests -m gpu -q -ra 2>&1 | tee -a "$OUT/pytest_gpu.log"

step "property tests end to end on CUDA tensors (JIT plans + torch compress/store on the GPU)" | tee "$OUT/pytest_props_cuda.log"
FLASHCOMPRESS_TEST_DEVICE=cuda python3 -m pytest tests/test_properties.py -q -ra 2>&1 | tail -15 | tee -a "$OUT/pytest_props_cuda.log"

step "demo on the GPU" | tee "$OUT/demo.log"
python3 -m flashcompress demo 2>&1 | tee -a "$OUT/demo.log"

step "benchmarks" | tee "$OUT/bench.log"
echo "--- benchmarks/bench_plans.py" | tee -a "$OUT/bench.log"
python3 benchmarks/bench_plans.py 2>&1 | tee -a "$OUT/bench.log"
echo "--- benchmarks/bench_host_overhead.py (cuda, B=64)" | tee -a "$OUT/bench.log"
python3 benchmarks/bench_host_overhead.py --device cuda 2>&1 | tee -a "$OUT/bench.log"
echo "--- benchmarks/jit_bench.py (quick: 1 cold build, 3 fresh-process loads)" | tee -a "$OUT/bench.log"
python3 benchmarks/jit_bench.py --reps 1 --load-reps 3 --variants plan 2>&1 | tee -a "$OUT/bench.log"
step "done" | tee -a "$OUT/bench.log"
