set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/python CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1 FLASHCOMPRESS_CACHE_DIR=/tmp/fc-cache
t0=$(date +%s)
timeout 200 python3 -m pytest tests -m gpu -q -ra -p no:cacheprovider -k "many_closing or c128 or golden" > $OUT/pytest_subset.log 2>&1; echo "pytest rc=$?"
tail -4 $OUT/pytest_subset.log; grep -E "^(FAILED|E  )" $OUT/pytest_subset.log | head -10
echo "subset done at $(( $(date +%s) - t0 )) s"
C="decode-B1-rand:c128-512,decode-B128-rand:c128-512,decode-B512-rand:c128-512,decode-B128-bnd:c128-512,decode-B512-bnd:c128-512"
timeout 200 bash scripts/ab_bench.sh bench_pipeline.py --cases "$C" --reps 20 2>&1 | tail -12
echo "ab done at $(( $(date +%s) - t0 )) s"
for tool in racecheck memcheck; do
timeout 120 compute-sanitizer --tool $tool --error-exitcode 3 python3 -m pytest tests -m gpu -q -p no:cacheprovider -k "many_closing and most" > $OUT/san_$tool.log 2>&1; echo "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" $OUT/san_$tool.log | tail -3
done
echo "all done at $(( $(date +%s) - t0 )) s"
