#!/usr/bin/env bash
# A/B of kernel sources in one GPU call: one benchmark script run against copies of this tree that
# differ only in their jit_kernel/ headers, each with its own JIT cache (the cache key hashes the
# sources), then the cold / graph times side by side. Two machines' timings differ by up to 30%
# (benchmarks/RESULTS.md), so versions are compared within one call, never across calls.
#
#   1. here (the lent GPU gets no .git; .whl/ is ignored, carry it):
#        bash scripts/ab_bench.sh --export REF [NAME]      # REF's jit_kernel/ -> .whl/ab/NAME/
#        bash scripts/ab_bench.sh --export REF NAME -D FC_SOME_KNOB=2 some_header.cuh
#                                                           # ... with a '#define X ...' knob reset
#   2. on the GPU, FC_COMMIT naming this tree's commit (device tool: run(command="FC_COMMIT=abc1234
#      bash scripts/ab_bench.sh bench_pipeline.py --cases
#      decode-B512-rand --reps 20", carry=[".whl"])):
#        bash scripts/ab_bench.sh BENCH [ARGS...]          # benchmarks/BENCH once per .whl/ab/*/
#                                                           # and once on this tree ("head")
#   Tables: $OUT/ab_<name>.md (OUT default ./gpu-out); the summary (case, layer, [path], then
#   cold / graph µs per version) is printed last. tvm-ffi is installed from .whl/*.whl when it is
#   not importable (as scripts/gpu_check.sh does).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
AB_DIR="${FC_AB_DIR:-$ROOT/.whl/ab}"   # FC_AB_DIR: elsewhere (tests)

if [ "${1:-}" = "--export" ]; then
  ref="${2:?--export needs a git ref}"
  name="${3:-$ref}"
  shift $(($# >= 3 ? 3 : 2))
  rm -rf "${AB_DIR:?}/$name" && mkdir -p "$AB_DIR/$name"
  fail() { echo "$1" >&2; rm -rf "${AB_DIR:?}/$name"; exit 1; }
  git archive "$ref" jit_kernel | tar -x -C "$AB_DIR/$name" --strip-components=1 || fail "git archive $ref failed"
  while [ "${1:-}" = "-D" ]; do
    def="${2%%=*}"; val="${2#*=}"; file="$AB_DIR/$name/${3:-}"
    [ -f "$file" ] && grep -q "^#define $def " "$file" || fail "no '#define $def' in jit_kernel/${3:-}"
    sed -i "s/^#define $def .*\$/#define $def $val/" "$file"
    shift 3
  done
  echo "exported $ref's jit_kernel/ to $AB_DIR/$name"
  exit 0
fi

bench="${1:?usage: ab_bench.sh BENCH [ARGS...] | --export REF [NAME] [-D NAME=VALUE FILE]...}"
shift
PY="${PYTHON:-python3}"
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
if ! "$PY" -c "import tvm_ffi" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "tvm-ffi is not importable and .whl/ has no wheel" >&2; exit 1; }
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi

names=(head)
for d in "$AB_DIR"/*/; do [ -d "$d" ] && names+=("$(basename "$d")"); done
for name in "${names[@]}"; do
  tree="$ROOT"
  if [ "$name" != head ]; then
    tree="/tmp/ab-tree-$name"
    rm -rf "$tree" && mkdir -p "$tree"
    cp -r "$ROOT/python" "$ROOT/templates" "$ROOT/benchmarks" "$ROOT/pyproject.toml" "$ROOT/.cache-config.toml" "$tree/"
    cp -r "$AB_DIR/$name" "$tree/jit_kernel"
    # the package's shipped defaults are a symlink to the repo-root .cache-config.toml
    [ -f "$tree/python/flashcompress/default-cache-config.toml" ] \
      || { echo "$name: the tree copy has no default-cache-config.toml (ab_bench.sh copies too little)" >&2; exit 1; }
  fi
  # the tables' header names the tree: FC_COMMIT for this one (a lent machine's git metadata can
  # be stale), the exported directory for the others
  label="${FC_COMMIT:-unknown}"
  [ "$name" != head ] && label="A/B tree $name (.whl/ab/$name)"
  (cd "$tree" && PYTHONPATH="$tree/python${PYTHONPATH:+:$PYTHONPATH}" FLASHCOMPRESS_CACHE_DIR="/tmp/ab-cache-$name" \
    FC_COMMIT="$label" "$PY" "benchmarks/$bench" "$@" --md "$OUT/ab_$name.md" >"$OUT/ab_$name.log" 2>&1)
  echo "$name: exit $? ($OUT/ab_$name.md)"
done

"$PY" - "$OUT" "${names[@]}" <<'PY'
import sys
out, names = sys.argv[1], sys.argv[2:]
rows: dict[tuple, dict] = {}
for name in names:
    try:
        lines = open(f"{out}/ab_{name}.md").read().splitlines()
    except OSError:
        continue
    head = None
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "cold us" in cells:
            head = cells
        elif head and len(cells) == len(head) and not set(cells[0]) <= {"-", " "}:
            key = tuple(cells[: head.index("cold us")])
            rows.setdefault(key, {})[name] = f"{cells[head.index('cold us')]} / {cells[head.index('graph us')]}"
print("| " + " | ".join(["row"] + names) + " |  (cold / graph us)")
for key, val in rows.items():
    print("| " + " | ".join([" ".join(key)] + [val.get(n, "-") for n in names]) + " |")
PY
