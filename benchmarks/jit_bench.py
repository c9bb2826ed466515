"""JIT engine benchmark: cold compile per variant, warm load in a fresh process, cached-call overhead.

    python benchmarks/jit_bench.py [--reps 3] [--variants selftest plan] [--compare-tvm-ffi] [--prewarm]

Everything runs in temporary cache directories (nothing touches the user cache).
Measured quantities:

  cold build     ``acquire(key)`` on an empty cache in a warm process (tvm-ffi, Jinja2 and
                 filelock already imported): render + compile (TUs in parallel) + link +
                 dlopen + publish.  Per step from the entry's manifest.
  fresh load     a new Python process that already imported torch (and initialised CUDA when a
                 GPU is present, as a real caller has): ``import tvm_ffi``,
                 ``import flashcompress.jit``, the engine and family modules (one-time imports,
                 reported separately), then the first ``get_module`` of a cached variant
                 (settings, digests, toolchain memo, manifest check, library size check,
                 dlopen, export check).  Three lookups: with the toolchain (the content key);
                 and without it (CUDA_HOME=/nonexistent, offline: any entry under the input digest).
  cached call    ``get_module(family, **params)`` after the first call (memo hit), and
                 ``load(key)`` with a prebuilt key, against a bare dict lookup.
  tvm-ffi build  (``--compare-tvm-ffi``) the same rendered sources through ``tvm_ffi.cpp.build``,
                 cold and its cached (ninja no-op) path, for comparison with the engine.
  prewarm        (``--prewarm``) ``flashcompress prewarm --model deepseek-v4-flash`` cold and warm.

Prints Markdown tables (the numbers in benchmarks/RESULTS.md come from this script).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))
os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")

VARIANTS = {
    "selftest": [{"value": 3, "block": 128}],
    "plan": [{"ratio": 4, "online": False}, {"ratio": 128, "online": False}, {"ratio": 128, "online": True}],
}


def _environ(cache_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHCOMPRESS_")}
    env.update(FLASHCOMPRESS_CACHE_DIR=str(cache_dir), FLASHCOMPRESS_SIZE_CAP_MB="0",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "python"), env.get("PYTHONPATH")])))
    if "FLASHCOMPRESS_CUDA_ARCH" in os.environ:
        env["FLASHCOMPRESS_CUDA_ARCH"] = os.environ["FLASHCOMPRESS_CUDA_ARCH"]
    return env


def _use_cache(cache_dir: Path) -> None:
    from flashcompress.jit import engine, render, settings, toolchain

    os.environ.update(_environ(cache_dir))
    settings.forget_settings()
    engine.clear_memo()
    render.clear_digest_memo()
    toolchain.clear_toolchain_memo()


def _keys(families: list[str]) -> list:
    from flashcompress.jit import VariantKey, make_key

    return [make_key(name, **params) for name in families for params in VARIANTS[name]]


def _fmt(values: list[float], unit: float = 1.0, digits: int = 2) -> str:
    scaled = [v * unit for v in values]
    if len(scaled) == 1:
        return f"{scaled[0]:.{digits}f}"
    return f"{statistics.median(scaled):.{digits}f} ({min(scaled):.{digits}f}–{max(scaled):.{digits}f})"


def bench_cold(families: list[str], reps: int, workdir: Path) -> tuple[list[list[str]], Path]:
    """Cold builds, ``reps`` times each in a fresh cache; returns table rows and the last cache dir."""
    from flashcompress.jit import acquire, build

    for lazily_imported in ("filelock", "jinja2", "tvm_ffi"):  # the engine imports these on first use;
        importlib.import_module(lazily_imported)              # keep them out of the timing

    rows = []
    last = workdir / "cold-0"
    per_key: dict[str, list[dict]] = {}
    for rep in range(reps):
        last = workdir / f"cold-{rep}"
        _use_cache(last)
        build.set_parallelism(max(2, os.cpu_count() or 2))
        for key in _keys(families):
            start = time.perf_counter()
            acquired = acquire(key)
            total = time.perf_counter() - start
            assert acquired.status == "built", acquired.status
            manifest = json.loads((acquired.path / "variant.json").read_text())
            steps = dict(manifest["build"]["steps"])
            per_key.setdefault(key.describe(), []).append({"total": total, **steps,
                                                           "so": manifest["library"]["size"]})
    for name, samples in per_key.items():
        compile_steps = sorted(k for k in samples[0] if k.startswith("compile"))
        rows.append([name, _fmt([s["total"] for s in samples]),
                     " / ".join(f"{k.split()[1]} {_fmt([s[k] for s in samples])}" for k in compile_steps),
                     _fmt([s["link"] for s in samples]), f"{samples[0]['so'] / 1024:.0f} KiB"])
    return rows, last


FRESH_LOAD = r"""
import json, sys, time
import torch
if torch.cuda.is_available():  # a real caller has initialised CUDA before it asks for a kernel
    torch.cuda.init()
    torch.cuda.current_device()
t0 = time.perf_counter()
import tvm_ffi
t1 = time.perf_counter()
import flashcompress.jit as jit
t2 = time.perf_counter()
from flashcompress.jit import engine   # imported lazily by the first get_module
jit.get_family(sys.argv[1])            # the family's module (the API layer imports it anyway)
t3 = time.perf_counter()
m = jit.get_module(sys.argv[1], **json.loads(sys.argv[2]))
t4 = time.perf_counter()
print(json.dumps({"tvm_ffi_import": t1 - t0, "jit_import": t2 - t1, "engine_import": t3 - t2,
                  "first_get_module": t4 - t3}))
"""


LOAD_MODES = {
    # label: extra environment
    "toolchain present": {},
    "no toolchain (CUDA_HOME=/nonexistent, offline)": {"CUDA_HOME": "/nonexistent", "FLASHCOMPRESS_OFFLINE": "1"},
}


def bench_fresh_load(families: list[str], cache_dir: Path, reps: int) -> list[list[str]]:
    rows = []
    base_env = _environ(cache_dir)
    # Measure with bytecode cached, as in an installed package (pip compiles .pyc files); keep the
    # .pyc files out of the source tree.  One discarded run per variant writes them.
    base_env.pop("PYTHONDONTWRITEBYTECODE", None)
    base_env["PYTHONPYCACHEPREFIX"] = str(cache_dir.parent / "pycache")
    for name in families:
        params = VARIANTS[name][0]
        for mode, extra in LOAD_MODES.items():
            env = dict(base_env, **extra)
            samples = []
            for rep in range(reps + 1):
                proc = subprocess.run([sys.executable, "-c", FRESH_LOAD, name, json.dumps(params)], env=env,
                                      capture_output=True, text=True)
                if proc.returncode:
                    raise RuntimeError(f"fresh load ({mode}) failed:\n{proc.stderr}")
                if rep:
                    samples.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            rows.append([f"{name}({', '.join(f'{k}={v}' for k, v in params.items())})", mode,
                         _fmt([s["first_get_module"] for s in samples], 1e3),
                         _fmt([s["engine_import"] for s in samples], 1e3),
                         _fmt([s["jit_import"] for s in samples], 1e3),
                         _fmt([s["tvm_ffi_import"] for s in samples], 1e3)])
    return rows


def bench_cached_call(families: list[str], cache_dir: Path) -> list[list[str]]:
    from flashcompress import jit

    _use_cache(cache_dir)
    name = families[-1]
    params = VARIANTS[name][0]
    jit.get_module(name, **params)
    key = jit.make_key(name, **params)
    memo = {("x", 1): 1}
    rows = []
    for label, stmt in [
        (f"get_module({name!r}, {', '.join(f'{k}={v!r}' for k, v in params.items())})",
         lambda: jit.get_module(name, **params)),
        ("load(key)", lambda: jit.load(key)),
        ("baseline: dict lookup", lambda: memo[("x", 1)]),
    ]:
        number = 200_000
        best = min(timeit.repeat(stmt, number=number, repeat=5)) / number
        rows.append([label, f"{best * 1e9:.0f}"])
    return rows


def bench_tvm_ffi_build(cache_dir: Path, workdir: Path) -> list[list[str]]:
    """Same rendered plan sources through tvm_ffi.cpp.build (its own ninja file and cache)."""
    import tvm_ffi.cpp

    from flashcompress.jit import VariantKey, make_key, get_family
    from flashcompress.jit.render import kernel_include_dir, render_sources

    _use_cache(cache_dir)
    name = "plan" if "plan" in VARIANTS else "selftest"
    key = make_key(name, **VARIANTS[name][0])
    src_dir = workdir / "tvmffi-src"
    src_dir.mkdir(exist_ok=True)
    files = []
    for fname, text in render_sources(key, get_family(name)).items():
        (src_dir / fname).write_text(text)
        if fname.endswith((".cu", ".cpp")):
            files.append(str(src_dir / fname))
    os.environ["TVM_FFI_CUDA_ARCH_LIST"] = "9.0a"
    kwargs = dict(sources=files, extra_cflags=["-fvisibility=hidden"],
                  extra_cuda_cflags=["--expt-relaxed-constexpr", "-Xcompiler", "-fvisibility=hidden"],
                  extra_include_paths=[str(kernel_include_dir()), f"{os.environ['CUDA_HOME']}/include"],
                  build_directory=str(workdir / "tvmffi-build"))
    start = time.perf_counter()
    tvm_ffi.cpp.build(key.module_name, **kwargs)
    cold = time.perf_counter() - start
    warm = min(timeit.repeat(lambda: tvm_ffi.cpp.build(key.module_name, **kwargs), number=1, repeat=5))
    return [[f"tvm_ffi.cpp.build, {key.describe()}", f"{cold:.2f} s", f"{warm * 1e3:.1f} ms"]]


def bench_prewarm(workdir: Path) -> list[list[str]]:
    env = _environ(workdir / "prewarm-cache")
    rows = []
    for label in ("cold", "warm"):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "flashcompress", "prewarm", "--model", "deepseek-v4-flash"],
                              env=env, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"prewarm failed:\n{proc.stdout}\n{proc.stderr}")
        rows.append([f"prewarm --model deepseek-v4-flash ({label}, default -j)",
                     f"{time.perf_counter() - start:.2f} s (incl. ~1-2 s Python/torch start)"])
    return rows


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="cold builds per variant")
    parser.add_argument("--load-reps", type=int, default=5, help="fresh processes per variant")
    parser.add_argument("--variants", nargs="+", default=["selftest", "plan"], choices=sorted(VARIANTS))
    parser.add_argument("--compare-tvm-ffi", action="store_true")
    parser.add_argument("--prewarm", action="store_true")
    args = parser.parse_args()

    from flashcompress.jit import family

    family.discover_families()
    families = [f for f in args.variants if f == "selftest" or f in family.families()]
    cpus = len(os.sched_getaffinity(0))
    print(f"# JIT engine benchmark — {platform.node()}, {cpus} cores, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}\n")
    with tempfile.TemporaryDirectory(prefix="fc-jit-bench-") as tmp:
        workdir = Path(tmp)
        cold_rows, cache_dir = bench_cold(families, args.reps, workdir)
        print(f"## Cold build per variant (s; median (min–max) of {args.reps}, fresh cache each time)\n")
        print(table(["variant", "total", "compile steps (parallel)", "link", ".so"], cold_rows), "\n")
        print(f"## First get_module of a cached variant in a fresh process (ms; median (min–max) of "
              f"{args.load_reps}; torch imported and CUDA initialised if present)\n")
        print(table(["variant", "lookup", "first get_module", "engine + family module import",
                     "import flashcompress.jit", "import tvm_ffi"],
                    bench_fresh_load(families, cache_dir, args.load_reps)), "\n")
        print("## Cached call overhead (ns per call, best of 5 x 200k)\n")
        print(table(["call", "ns"], bench_cached_call(families, cache_dir)), "\n")
        if args.compare_tvm_ffi:
            print("## For comparison: tvm_ffi.cpp.build on the same rendered sources\n")
            print(table(["build", "cold", "cached call (ninja no-op)"], bench_tvm_ffi_build(cache_dir, workdir)),
                  "\n")
        if args.prewarm:
            print("## Prewarm wall time\n")
            print(table(["command", "wall"], bench_prewarm(workdir)), "\n")


if __name__ == "__main__":
    main()
