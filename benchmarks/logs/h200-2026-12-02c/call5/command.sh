set -o pipefail
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 FC_COMMIT=54b7d0d
t0=$(date +%s)
FC_STEPS=prewarm,pytest timeout 330 bash scripts/gpu_check.sh > /dev/null 2>&1; echo "gpu_check rc=$?"
cat $OUT/summary.md | grep -E "^\|" | head -8
grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_check.log | tail -8
echo "pytest done at $(( $(date +%s) - t0 )) s"
C="decode-B1-rand:c4-512,decode-B128-rand:c4-512,decode-B512-rand:c4-512,decode-B512-bnd:c4-512,prefill-8192:c4-512,prefill-32768:c4-512,decode-B128-rand:c128-online,decode-B512-rand:c128-online"
timeout 240 bash scripts/ab_bench.sh bench_pipeline.py --cases "$C" --reps 20 2>&1 | tail -18
echo "ab done at $(( $(date +%s) - t0 )) s"
