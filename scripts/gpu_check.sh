#!/usr/bin/env bash
# The GPU entry script: prewarm, GPU parity tests, property tests on CUDA tensors, the demo,
# compute-sanitizer passes and the benchmarks.  The same script runs in three places:
#
#   * a developer on a lent GPU, from the repo root (the device tool; tvm-ffi is not on that
#     image, so carry its wheel in .whl/):   run(command="bash scripts/gpu_check.sh", carry=[".whl"])
#   * the GPU workflow (.github/workflows/gpu.yml) on a self-hosted runner, in a fresh venv;
#   * any GPU box:                            OUT=/tmp/gpu-out bash scripts/gpu_check.sh
#
# Environment (all optional):
#   OUT                 where logs and tables go (default ./gpu-out).  At most 8 files are written:
#                       gpu_check.log (everything printed), summary.md (pass/fail per step + the
#                       benchmark tables), bench_compress.md, bench_store.md, bench_pipeline.md
#                       (compress and pipeline: their bf16-input prefill rows appended).
#   FC_STEPS            comma list of steps to run, default all:
#                       prewarm,pytest,props,demo,sanitizer,bench   (the environment is always shown)
#   FC_SANITIZER_TESTS  pytest -k expression of the GPU tests run under compute-sanitizer
#   FC_SANITIZER_TOOLS  sanitizer tools, default "memcheck racecheck"
#   FC_BENCH_SHORT=1    run the benchmark scripts with --short (CI); default: full mode
#   FC_MODEL            model for prewarm (default deepseek-v4-flash)
#   FC_DRY_RUN=1        print the commands instead of running them (tests/test_workflows.py)
#   PYTHON              interpreter (default python3)
#   FC_COMMIT           the commit to report where the tree has no .git (default: git rev-parse)
#
# Exit status: 0 if every selected step passed (or was skipped with a note), else 1.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-$PWD/gpu-out}"
FC_STEPS="${FC_STEPS:-prewarm,pytest,props,demo,sanitizer,bench}"
known_step() {
  case "$1" in prewarm|pytest|props|demo|sanitizer|bench) return 0 ;; *) return 1 ;; esac
}

for s in ${FC_STEPS//,/ }; do
  known_step "$s" || { echo "unknown step '$s' in FC_STEPS (known: prewarm,pytest,props,demo,sanitizer,bench)" >&2; exit 2; }
done
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
SUMMARY="$OUT/summary.md"
: >"$LOG"
PY="${PYTHON:-python3}"
FC_SANITIZER_TESTS="${FC_SANITIZER_TESTS:-gpu_compress or gpu_store or gpu_pipeline or (gpu_plans and matches_torch)}"
FC_SANITIZER_TOOLS="${FC_SANITIZER_TOOLS:-memcheck racecheck}"
FC_MODEL="${FC_MODEL:-deepseek-v4-flash}"
DRY="${FC_DRY_RUN:-0}"
export PYTHONUNBUFFERED=1
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export FLASHCOMPRESS_CACHE_DIR="${FLASHCOMPRESS_CACHE_DIR:-/tmp/fc-cache}"

RESULTS=()   # "name|status|seconds|note" per step
FAILED=0

log() { echo "$*" | tee -a "$LOG"; }

wanted() {
  case ",${FC_STEPS// /}," in *",$1,"*) return 0 ;; *) return 1 ;; esac
}

record() {  # record NAME STATUS SECONDS NOTE
  local status="$2"
  if [ "$DRY" = "1" ] && [ "$status" = "PASS" ]; then status="DRY"; fi
  set -- "$1" "$status" "$3" "$4"
  RESULTS+=("$1|$2|$3|$4")
  [ "$2" = "FAIL" ] && FAILED=1
  log "--- $1: $2${4:+ ($4)} after ${3}s"
}

# run_cmd NAME CMD...: run one command of a step, everything into the log; returns its status.
run_cmd() {
  local name="$1"; shift
  local shown
  shown="$(printf '%q ' "$@")"
  log ""
  log "=== $name ($(date -u +%H:%M:%S)): ${shown% }"
  if [ "$DRY" = "1" ]; then
    return 0
  fi
  "$@" 2>&1 | tee -a "$LOG"
  return "${PIPESTATUS[0]}"
}

# step NAME CMD...: a whole step that is one command.
step() {
  local name="$1"; shift
  local t0=$SECONDS rc=0
  run_cmd "$name" "$@" || rc=$?
  if [ "$rc" -eq 0 ]; then record "$name" PASS $((SECONDS - t0)) ""; else record "$name" FAIL $((SECONDS - t0)) "exit $rc"; fi
}


# ------------------------------------------------------------------ environment
if [ "$DRY" != "1" ]; then
  # tvm-ffi is not on the lent GPU's image: install the carried wheel into a private site dir.
  if ! "$PY" -c "import tvm_ffi" 2>/dev/null; then
    if compgen -G ".whl/*.whl" >/dev/null; then
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { log "tvm-ffi wheel install from .whl/ failed"; exit 1; }
      export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    else
      log "apache-tvm-ffi is not importable and no wheel in .whl/: install the package (pip install '.[test]') or carry the wheel"
      exit 1
    fi
  fi
fi
# The package runs from the source tree (the lent GPU has no network for an install; in a
# venv with the package installed this is the same code).
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"

log "=== environment ($(date -u +%Y-%m-%dT%H:%M:%SZ)); steps: $FC_STEPS; OUT=$OUT"
if [ "$DRY" != "1" ]; then
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || echo "nvidia-smi not found"
    "$PY" -c "import torch, tvm_ffi; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'tvm_ffi', tvm_ffi.__version__, 'gpu', torch.cuda.is_available())"
    "$CUDA_HOME/bin/nvcc" --version 2>/dev/null | tail -1 || echo "nvcc not found under $CUDA_HOME"
    echo "commit ${FC_COMMIT:-$(git log --oneline -1 2>/dev/null || echo unknown)}"
  } 2>&1 | tee -a "$LOG"
fi
T_START=$SECONDS

# ------------------------------------------------------------------ prewarm (cold, then warm)
if wanted prewarm; then
  t0=$SECONDS; rc=0
  run_cmd "prewarm $FC_MODEL (cold)" "$PY" -m flashcompress prewarm --model "$FC_MODEL" || rc=$?
  cold=$((SECONDS - t0))
  run_cmd "prewarm $FC_MODEL (warm: must compile nothing)" "$PY" -m flashcompress prewarm --model "$FC_MODEL" || rc=$?
  if [ "$rc" -eq 0 ]; then record prewarm PASS $((SECONDS - t0)) "cold ${cold}s"; else record prewarm FAIL $((SECONDS - t0)) "exit $rc"; fi
fi

# ------------------------------------------------------------------ GPU parity tests
if wanted pytest; then
  step pytest "$PY" -m pytest tests -m gpu -q -ra -p no:cacheprovider
fi

if wanted props; then
  FLASHCOMPRESS_TEST_DEVICE=cuda step props "$PY" -m pytest tests/test_properties.py -q -ra -p no:cacheprovider
fi

if wanted demo; then
  step demo "$PY" -m flashcompress demo
fi

# ------------------------------------------------------------------ compute-sanitizer over a subset
find_sanitizer() {
  local c
  for c in "$(command -v compute-sanitizer 2>/dev/null)" "$CUDA_HOME/bin/compute-sanitizer" \
           "$CUDA_HOME/compute-sanitizer/compute-sanitizer"; do
    if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  return 1
}

if wanted sanitizer; then
  SAN="$(find_sanitizer || true)"
  if [ -z "$SAN" ] && [ "$DRY" = "1" ]; then SAN=compute-sanitizer; fi
  if [ -z "$SAN" ]; then
    log "compute-sanitizer not found (PATH, \$CUDA_HOME/bin): sanitizer step skipped"
    record sanitizer SKIP 0 "compute-sanitizer not found"
  else
    for tool in $FC_SANITIZER_TOOLS; do
      t0=$SECONDS; rc=0
      # No caching allocator: memcheck must see every allocation's real bounds.
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 run_cmd "sanitizer $tool" "$SAN" --tool "$tool" --error-exitcode 1 \
        "$PY" -m pytest tests -m gpu -k "$FC_SANITIZER_TESTS" -q -ra -p no:cacheprovider -x || rc=$?
      if [ "$rc" -eq 0 ]; then
        record "sanitizer $tool" PASS $((SECONDS - t0)) ""
      elif [ "$rc" -eq 5 ]; then
        record "sanitizer $tool" SKIP $((SECONDS - t0)) "no test matches -k '$FC_SANITIZER_TESTS'"
      else
        record "sanitizer $tool" FAIL $((SECONDS - t0)) "exit $rc"
      fi
    done
  fi
fi

# ------------------------------------------------------------------ benchmarks
if wanted bench; then
  short=()
  [ "${FC_BENCH_SHORT:-0}" = "1" ] && short=(--short)
  for name in compress store pipeline; do
    script="benchmarks/bench_$name.py"
    if [ ! -f "$script" ]; then
      log "$script does not exist: skipped"
      record "bench $name" SKIP 0 "$script not found"
      continue
    fi
    step "bench $name" "$PY" "$script" --md "$OUT/bench_$name.md" "${short[@]}"
  done
  # bf16 input (fp32 state, the engine's mixed case): the prefill rows, appended to the same tables
  for name in compress pipeline; do
    [ -f "benchmarks/bench_$name.py" ] || continue
    step "bench $name bf16" "$PY" "benchmarks/bench_$name.py" --in-dtype bf16 --cases prefill --md "$OUT/bench_$name.md"
  done
  # The older benchmarks print to the log only.
  step "bench plans" "$PY" benchmarks/bench_plans.py
  step "bench host overhead" "$PY" benchmarks/bench_host_overhead.py --device cuda
  step "bench jit" "$PY" benchmarks/jit_bench.py --reps 1 --load-reps 3 --variants plan
fi

# ------------------------------------------------------------------ summary.md
{
  echo "# gpu_check summary"
  echo
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), commit ${FC_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}, steps: $FC_STEPS, total $((SECONDS - T_START)) s"
  echo
  echo "| step | status | seconds | note |"
  echo "| --- | --- | --- | --- |"
  for r in "${RESULTS[@]}"; do
    IFS='|' read -r n st sec note <<<"$r"
    echo "| $n | $st | $sec | $note |"
  done
  for name in compress store pipeline; do
    md="$OUT/bench_$name.md"
    if [ -s "$md" ]; then
      echo
      echo "## bench_$name"
      echo
      cat "$md"
    fi
  done
} >"$SUMMARY"
log ""
tee -a "$LOG" <"$SUMMARY"
log "=== done: $([ "$FAILED" -eq 0 ] && echo "all steps passed" || echo "FAILED"); logs in $OUT"
exit "$FAILED"
