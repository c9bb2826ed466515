#!/usr/bin/env bash
# session 11 call 5: branch next/plan-first (knob on) vs off (= main's kernels): C4 decode only. No parity run.
set -u
ROOT=$PWD
export CUDA_HOME=/usr/local/cuda PYTHONUNBUFFERED=1
mkdir -p /tmp/abc
OUT=/tmp/abc FC_AB_DIR=$ROOT/.whl/abc timeout 170 bash scripts/ab_bench.sh bench_pipeline.py --cases "decode-B128-rand:c4-512,decode-B512-rand:c4-512,decode-B512-rand:c4-128" --reps 15 2>&1 | tail -8
tar czf $OUT/ab.tgz -C /tmp abc 2>/dev/null
