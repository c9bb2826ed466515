"""HIP compile checks of every kernel family: plan, compress, store (the fused path is the
compress family with a store format). ``pytest -m nvcc``; nothing here runs on an AMD GPU.

Everywhere (no HIP toolchain needed):
* the HIP side of the kernel headers and templates (CUDA-only ``#if !FC_GPU_HIP`` / ``#else``
  branches removed) spells the GPU runtime only through jit_kernel/gpu_runtime.h (no ``cuda*``
  runtime names, no ``<cuda_runtime.h>``) and uses no 32-lane warp intrinsics;
* a ``hip:`` target renders ``kDLROCM`` and the backend static_asserts, and the engine's HIP
  command lines define ``__HIP_PLATFORM_AMD__`` for both TUs (what gpu_runtime.h keys on);
* the variants built below are exactly what ``flashcompress prewarm --model deepseek-v4-flash``
  builds for HIP, plus bf16 variants (the HIP bf16 helpers and the bf16 cache format).

Targets, one parametrized test per (family, variant, target, check), each failing with the
compiler's first error:
* gfx90a (MI200), Debian's ``hipcc`` 5.2.3 (``apt-get install hipcc``; ../shared/spec/hip.md):
  the kernel TU with the engine's exact hipcc command plus ``-Wall -Wextra`` (no warning from
  our code, a gfx90a code object with the family's kernels), and the whole variant through the
  engine (binding TU with the host compiler and the HIP headers, link against libamdhip64): it
  loads on this GPU-less machine, exports the family's functions and rejects host tensors as
  not being ``rocm`` tensors.
* gfx942 (MI300X), Debian's ``clang++-19`` with the same ROCm 5.2 headers: device code only
  (``--offload-device-only -S -nogpulib``: HIP 5.2 ships no gfx942 device libraries, so there
  is no device link), the engine's device flags plus ``-Wall -Wextra``: full gfx942 ISA of every
  kernel, and no hardware FP8 conversion instruction (those are FNUZ on gfx942; our bytes are
  OCP e4m3 from quant.cuh's software path).
* quant.cuh's conversions: a probe TU static_asserts, in the device pass of both targets, that
  the HIP device code takes the branches that tests/test_store_kernel_host.py checks bit for bit
  on the host (no ``__CUDA_ARCH__``, FC_QUANT_HW_E4M3 == 0), and that vec.cuh's HIP bf16 type is
  our own (quant.cuh's RNE helpers), not hip_bfloat16.
Skipped cleanly when ``hipcc`` / ``clang++-19`` are absent.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from _jit_helpers import clean_environ, reset_engine
from flashcompress import layouts as L

pytestmark = pytest.mark.nvcc  # CPU-only compiler build checks (pyproject has no hipcc marker)

MODEL = "deepseek-v4-flash"
HIP_TARGET = "hip:gfx90a"
MI300_TARGET = "hip:gfx942"
FAMILIES = ("plan", "compress", "store")
PLAN_VARIANTS = [
    {"ratio": 4, "online": False},
    {"ratio": 128, "online": False},
    {"ratio": 128, "online": True},
]
_BF16 = {"in_dtype": "bf16", "state_dtype": "bf16", "out_dtype": "bf16"}
# Beyond the model preset (fp32): bf16 tensors (vec.cuh's HIP bf16 type), mixed dtypes, the bf16
# cache format, and a C128 store from bf16 rows (the HIP whole-row C128 tiling).
EXTRA_VARIANTS: dict[str, list[dict]] = {
    "plan": [],
    "compress": [
        {"ratio": 4, "online": False, "head_dim": 512, **_BF16, "store": "none"},
        {"ratio": 4, "online": False, "head_dim": 512, "in_dtype": "bf16", "state_dtype": "f32",
         "out_dtype": "bf16", "store": "bf16"},
        {"ratio": 4, "online": False, "head_dim": 128, **_BF16, "store": "idx_fp4"},
        {"ratio": 128, "online": False, "head_dim": 512, **_BF16, "store": "v4"},
    ],
    "store": [
        {"head_dim": 512, "fmt": "bf16", "dtype": "bf16"},
        {"head_dim": 128, "fmt": "idx_fp8", "dtype": "bf16"},
    ],
}
# Kernels each family's kernel TU must contain (mangled names contain these).
KERNELS = {
    "plan": ["prefill_scan_kernel"],
    "compress": ["decode_kernel", "prefill_kernel"],
    "store": ["store_kernel"],
}


def _preset(family: str) -> list[dict]:
    from flashcompress.jit import get_family

    return get_family(family).preset_params(MODEL)


def _variants() -> list[tuple[str, dict]]:
    out = []
    for family in FAMILIES:
        for params in [*_preset(family), *EXTRA_VARIANTS[family]]:
            if (family, params) not in out:
                out.append((family, params))
    return out


VARIANTS = _variants()


def _variant_id(item: tuple[str, dict]) -> str:
    family, params = item
    return family + "-" + "-".join(str(v) for v in params.values())


VARIANT_IDS = [_variant_id(v) for v in VARIANTS]


def _plan_id(params: dict) -> str:
    return f"r{params['ratio']}_online{int(params['online'])}"


# ----------------------------------------------------------------------------- toolchains


def _find_hipcc() -> Path | None:
    """hipcc as the engine's toolchain finds it: $ROCM_HOME/$ROCM_PATH or /opt/rocm, else PATH."""
    root = os.environ.get("ROCM_HOME") or os.environ.get("ROCM_PATH") or "/opt/rocm"
    candidate = Path(root) / "bin" / "hipcc"
    if candidate.exists():
        return candidate
    found = shutil.which("hipcc")
    return Path(found) if found else None


def hip_toolchain_missing() -> str | None:
    """Why HIP compile checks cannot run here, or None."""
    if _find_hipcc() is None:
        return "hipcc not found (set ROCM_PATH, or apt-get install hipcc)"
    if shutil.which(os.environ.get("CXX") or "c++") is None:
        return "no host C++ compiler"
    try:
        import tvm_ffi  # noqa: F401
    except ImportError:
        return "apache-tvm-ffi is not installed"
    return None


def _rocm_headers_root() -> Path | None:
    """The prefix whose include/hip/hip_runtime.h clang-19 compiles against (Debian: /usr)."""
    hipcc = _find_hipcc()
    candidates = [hipcc.resolve().parent.parent] if hipcc else []
    candidates += [Path(os.environ.get("ROCM_PATH") or "/opt/rocm"), Path("/usr")]
    for root in candidates:
        if (root / "include" / "hip" / "hip_runtime.h").exists():
            return root
    return None


def _find_clang19() -> str | None:
    return shutil.which("clang++-19")


def gfx942_toolchain_missing() -> str | None:
    if _find_clang19() is None:
        return "clang++-19 not found (apt-get install clang-19 lld-19)"
    if _rocm_headers_root() is None:
        return "HIP headers not found (apt-get install hipcc)"
    return None


requires_hipcc = pytest.mark.skipif(hip_toolchain_missing() is not None, reason=str(hip_toolchain_missing()))
requires_clang19 = pytest.mark.skipif(gfx942_toolchain_missing() is not None,
                                      reason=str(gfx942_toolchain_missing()))

# A warning whose primary location is one of our files: jit_kernel/ headers or a rendered TU
# (./kernel.cu, ./binding.cpp). tvm-ffi's own header warnings (unused parameters in its export
# macro) are not ours.
_WARNING = re.compile(r"^(?P<path>[^\s:()]+)(?::\d+(?::\d+)?:|\(\d+\):)\s*warning\b")


def own_warnings(output: str, include_dir: Path) -> list[str]:
    found = []
    for line in output.splitlines():
        m = _WARNING.match(line.strip())
        if not m:
            continue
        path = m.group("path")
        if path.startswith("./") or "/" not in path or path.startswith(str(include_dir)):
            found.append(line)
    return found


def first_error(output: str) -> str:
    from flashcompress.jit.build import first_error_lines

    return "\n".join(first_error_lines(output))


# ----------------------------------------------------------------------------- sources (no hipcc)

# CUDA runtime spellings that must go through gpu_runtime.h, and 32-lane warp intrinsics that
# break or do not exist on wave64 / HIP 5.2.
_CUDA_RUNTIME = re.compile(r"\bcuda[A-Z]\w*|cuda_runtime|hip_runtime|CUDADeviceGuard|TVM_FFI_CHECK_CUDA_ERROR"
                           r"|cooperative_groups|cuda_bf16|cuda_fp8|hip_bf16\.h|hip_fp8\.h")
_WARP_32 = re.compile(r"__shfl\w*_sync|__syncwarp|__activemask|__ballot_sync|__any_sync|__all_sync")
_DIRECTIVE = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif|else|endif)\b(.*)$")


def _code_only(text: str) -> str:
    """Drop // comments (our headers use no block comments)."""
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def hip_view(text: str) -> str:
    """The lines a HIP compile sees, as far as FC_GPU_HIP decides: ``#if FC_GPU_HIP`` keeps its
    first branch, ``#if !FC_GPU_HIP...`` its ``#else``; any other conditional keeps every branch."""
    out, stack = [], []  # stack entries: None (other conditional) or whether this branch is kept
    for line in _code_only(text).splitlines():
        m = _DIRECTIVE.match(line)
        if m:
            kind, cond = m.group(1), m.group(2).strip()
            if kind in ("if", "ifdef", "ifndef"):
                stack.append(True if cond == "FC_GPU_HIP" else (False if cond.startswith("!FC_GPU_HIP") else None))
            elif kind in ("elif", "else") and stack and stack[-1] is not None:
                stack[-1] = False if stack[-1] else kind == "else"
            elif kind == "endif" and stack:
                stack.pop()
            continue
        if all(s is not False for s in stack):
            out.append(line)
    return "\n".join(out)


def test_hip_view_strips_cuda_branches() -> None:
    text = "a\n#if FC_GPU_HIP\nb\n#else\nc\n#endif\n#if !FC_GPU_HIP && X\nd\n#if Y\ne\n#endif\n#else\nf\n#endif\n" \
           "#if Z\ng\n#else\nh\n#endif\n"
    assert hip_view(text).split() == ["a", "b", "f", "g", "h"]


def _shimmed_files() -> list[Path]:
    from flashcompress.jit.render import kernel_include_dir, template_dir

    headers = sorted(p for p in kernel_include_dir().iterdir()
                     if p.suffix in (".cuh", ".h") and p.name != "gpu_runtime.h")
    return headers + sorted(template_dir().glob("*.j2"))


def test_kernel_sources_use_the_runtime_shim() -> None:
    from flashcompress.jit.render import kernel_include_dir

    files = _shimmed_files()
    names = {p.name for p in files}
    assert {"plan_builder.cuh", "compress.cuh", "store.cuh", "quant.cuh", "vec.cuh",
            "compress_kernel.cu.j2", "store_kernel.cu.j2"} <= names, names
    for path in files:
        code = hip_view(path.read_text())
        cuda_names, warp_32 = _CUDA_RUNTIME.findall(code), _WARP_32.findall(code)
        assert not cuda_names, f"{path.name}: on HIP use the gpu_runtime.h names / own helpers, not {cuda_names}"
        assert not warp_32, f"{path.name}: warp intrinsics that assume 32 lanes: {warp_32}"
    shim = (kernel_include_dir() / "gpu_runtime.h").read_text()
    for name in ("gpuError_t", "gpuStream_t", "gpuSuccess", "gpuGetLastError", "gpuGetErrorString",
                 "<hip/hip_runtime.h>", "<cuda_runtime.h>", "__HIP_PLATFORM_AMD__", "kMaxWarpSize"):
        assert name in shim, f"gpu_runtime.h lacks {name}"


def test_variants_cover_the_hip_prewarm(private_env, monkeypatch) -> None:
    """What these tests build includes everything ``flashcompress prewarm --model`` builds for HIP."""
    from flashcompress.jit.prewarm import variant_set

    monkeypatch.setenv("FLASHCOMPRESS_GPU_BACKEND", "hip")
    monkeypatch.setenv("FLASHCOMPRESS_DEFAULT_HIP_ARCHS", "gfx90a")
    reset_engine()
    keys = variant_set(models=[MODEL])
    assert {k.family for k in keys if k.backend == "host"} == {"plan_host"}  # host C++ only, no HIP build
    keys = [k for k in keys if k.backend != "host"]
    assert {k.target for k in keys} == {HIP_TARGET}
    assert {k.family for k in keys} == set(FAMILIES)
    tested = {(f, tuple(sorted(p.items()))) for f, p in VARIANTS}
    missing = [k.describe() for k in keys if (k.family, tuple(sorted(k.param_dict.items()))) not in tested]
    assert not missing, f"prewarm variants without a HIP build test: {missing}"


@pytest.mark.parametrize("params", PLAN_VARIANTS, ids=_plan_id)
def test_hip_render(private_env, params) -> None:
    from flashcompress.jit import make_key, get_family
    from flashcompress.jit.render import render_sources

    fam = get_family("plan")
    hip = render_sources(make_key("plan", target=HIP_TARGET, **params), fam)
    cuda = render_sources(make_key("plan", target="cuda:9.0a", **params), fam)
    for name in ("kernel.cu", "binding.cpp"):
        # The GPU runtime (and the DLPack device type) follows the compile command (gpu_runtime.h),
        # so a variant's sources are the same for both backends apart from the generated header line.
        assert hip[name].split("\n", 1)[1] == cuda[name].split("\n", 1)[1], name
        assert not _CUDA_RUNTIME.findall(_code_only(hip[name])), name
        assert "kDLCUDA" not in hip[name]


@pytest.mark.parametrize("item", VARIANTS, ids=VARIANT_IDS)
def test_hip_render_every_family(private_env, item) -> None:
    """compress / store render for HIP from the same templates: no CUDA runtime, no PDL, kDLROCM."""
    from flashcompress.jit import make_key, get_family
    from flashcompress.jit.render import render_sources

    family, params = item
    hip = render_sources(make_key(family, target=HIP_TARGET, **params), get_family(family))
    for name, text in hip.items():
        code = hip_view(text)
        assert not _CUDA_RUNTIME.findall(code), name
        assert "kDLCUDA" not in code and "!FC_GPU_HIP" not in code, name
    if family in ("compress", "store"):
        assert "#define FC_ENABLE_PDL 0" in hip["kernel.cu"]
        cuda = render_sources(make_key(family, target="cuda:9.0a", **params), get_family(family))
        assert "#define FC_ENABLE_PDL 1" in cuda["kernel.cu"]  # programmatic dependents on sm_90
    if family == "store":
        assert "static_assert(FC_GPU_HIP," in hip["kernel.cu"] and "kDLROCM" in hip["binding.cpp"]


def test_hip_command_lines_select_the_hip_runtime(private_env) -> None:
    """gpu_runtime.h picks HIP from __HIP_PLATFORM_AMD__: both TUs of a HIP variant must define it."""
    from flashcompress.jit import make_key, build, get_family
    from flashcompress.jit.toolchain import Toolchain, TvmFfiInfo

    key = make_key("plan", target=HIP_TARGET, ratio=4, online=False)
    tc = Toolchain("hip", Path("/opt/rocm"), Path("/opt/rocm/bin/hipcc"), Path("/usr/bin/c++"), "hipcc x", "c++ y")
    tvm = TvmFfiInfo("0", (Path("/inc"),), Path("/lib"), "tvm_ffi")
    compiles, (link,) = build.plan_steps(key, get_family("plan"), tc, tvm, ["kernel.cu", "binding.cpp"],
                                         Path("/jk"), "m.so", Path("/leaf"))
    kernel, binding = compiles
    assert kernel.env == {"HIP_PLATFORM": "amd"}
    assert {"-x", "hip", "--offload-arch=gfx90a", "-D__HIP_PLATFORM_AMD__=1"} <= set(kernel.argv)
    assert "-D__HIP_PLATFORM_AMD__=1" in binding.argv
    assert "-lamdhip64" in link.argv
    assert not any("FC_QUANT_SOFTWARE_ONLY" in a for a in kernel.argv)  # HIP is software by itself
    cuda = make_key("plan", target="cuda:9.0a", ratio=4, online=False)
    tc_cuda = Toolchain("cuda", Path("/cuda"), Path("/cuda/bin/nvcc"), Path("/usr/bin/c++"), "nvcc x", "c++ y")
    compiles, _ = build.plan_steps(cuda, get_family("plan"), tc_cuda, tvm, ["kernel.cu", "binding.cpp"],
                                   Path("/jk"), "m.so", Path("/leaf"))
    assert not any("__HIP_PLATFORM" in a or a == "-DUSE_ROCM" for s in compiles for a in s.argv)


# ----------------------------------------------------------------------------- builds (module fixtures)


@pytest.fixture(scope="module")
def hip_env(tmp_path_factory: pytest.TempPathFactory):
    """One private cache for this module's HIP builds (the variants are built once, in parallel)."""
    base = tmp_path_factory.mktemp("hip_build")
    env = clean_environ(base / "cache", base / "xdg")
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.startswith("FLASHCOMPRESS_")]:
            mp.delenv(key)
        for key, value in env.items():
            mp.setenv(key, value)
        reset_engine()
        yield base
    reset_engine()


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


def _kernel_step(key, workdir: Path):
    """The engine's compile step of ``key``'s kernel.cu, rendered into ``workdir``."""
    from flashcompress.jit import build, get_family
    from flashcompress.jit.render import kernel_include_dir, render_sources
    from flashcompress.jit.toolchain import Toolchain, TvmFfiInfo, get_toolchain

    fam = get_family(key.family)
    sources = render_sources(key, fam)
    workdir.mkdir(parents=True, exist_ok=True)
    for name, text in sources.items():
        (workdir / name).write_text(text)
    if _find_hipcc() is not None:
        toolchain = get_toolchain("hip", None)
    else:  # gfx942 only: the command shape, with clang++-19 substituted below
        toolchain = Toolchain("hip", Path("/opt/rocm"), Path("/opt/rocm/bin/hipcc"), Path("/usr/bin/c++"), "", "")
    unused_tvm = TvmFfiInfo("0", (), workdir, "tvm_ffi")  # the kernel TU sees no tvm-ffi
    compiles, _ = build.plan_steps(key, fam, toolchain, unused_tvm, list(sources), kernel_include_dir(),
                                   "module.so", workdir)
    return next(s for s in compiles if s.label == "compile kernel.cu")


def _run(argv: list[str], cwd: Path, env: dict | None = None) -> tuple[int, str]:
    res = subprocess.run(argv, cwd=cwd, env=dict(os.environ, **(env or {})), capture_output=True, text=True,
                         errors="replace", timeout=900)
    return res.returncode, res.stdout + res.stderr


@pytest.fixture(scope="module")
def gfx90a_engine(hip_env):
    """Every variant built for gfx90a through the engine (parallel, like prewarm): {id: result}."""
    from flashcompress.jit import get_family
    from flashcompress.jit.prewarm import run_prewarm

    keys = [get_family(f).key(HIP_TARGET, **p) for f, p in VARIANTS]
    results = run_prewarm(keys, jobs=_cores())
    return dict(zip(VARIANT_IDS, results))


@pytest.fixture(scope="module")
def gfx90a_kernel_tus(hip_env):
    """Every kernel.cu compiled by the engine's hipcc command plus -Wall -Wextra: {id: (cmd, rc, out, obj)}."""
    from flashcompress.jit import get_family

    def one(i: int):
        family, params = VARIANTS[i]
        work = hip_env / "tu90a" / VARIANT_IDS[i]
        step = _kernel_step(get_family(family).key(HIP_TARGET, **params), work)
        argv = [step.argv[0], "-Wall", "-Wextra", *step.argv[1:]]
        rc, out = _run(argv, work, dict(step.env))
        obj = (work / "kernel.cu.o").read_bytes() if rc == 0 else b""
        return step.command, rc, out, obj

    with ThreadPoolExecutor(_cores()) as pool:
        return dict(zip(VARIANT_IDS, pool.map(one, range(len(VARIANTS)))))


def gfx942_argv(step, asm: str) -> list[str]:
    """The engine's HIP device flags with clang++-19, device code only, for gfx942."""
    root = _rocm_headers_root()
    argv = [_find_clang19(), "-x", "hip", f"--rocm-path={root}", "-nogpulib", "--offload-device-only", "-S",
            "-Wall", "-Wextra"]
    args = list(step.argv[1:])
    out = args.index("-o")
    del args[out:out + 2]
    args = [a for a in args if a not in ("-c", "-x", "hip")]
    return [*argv, *args, "-o", asm]


@pytest.fixture(scope="module")
def gfx942_device(hip_env):
    """Every kernel.cu's gfx942 device code (clang++-19): {id: (cmd, rc, out, asm text)}."""
    from flashcompress.jit import get_family

    def one(i: int):
        family, params = VARIANTS[i]
        work = hip_env / "tu942" / VARIANT_IDS[i]
        step = _kernel_step(get_family(family).key(MI300_TARGET, **params), work)
        argv = gfx942_argv(step, "kernel.gfx942.s")
        rc, out = _run(argv, work)
        asm = (work / "kernel.gfx942.s").read_text() if rc == 0 else ""
        return " ".join(argv), rc, out, asm

    with ThreadPoolExecutor(_cores()) as pool:
        return dict(zip(VARIANT_IDS, pool.map(one, range(len(VARIANTS)))))


def _expected_kernels(family: str, params: dict) -> list[str]:
    names = list(KERNELS[family])
    if family == "plan":
        names += (["online_decode_kernel", "online_stage1_kernel", "online_prefill_rows_kernel"] if params["online"]
                  else ["decode_kernel", "prefill_stage1_kernel", "prefill_rows_kernel"])
    if family == "compress" and not params["online"]:
        names.append("write_kernel")
    return names


# ----------------------------------------------------------------------------- gfx90a (hipcc)


@requires_hipcc
@pytest.mark.parametrize("item", VARIANTS, ids=VARIANT_IDS)
def test_kernel_tu_compiles_for_gfx90a(gfx90a_kernel_tus, item) -> None:
    from flashcompress.jit.render import kernel_include_dir

    command, rc, output, obj = gfx90a_kernel_tus[_variant_id(item)]
    assert rc == 0, f"hipcc failed for gfx90a: {first_error(output)}\n$ {command}"
    warnings = own_warnings(output, kernel_include_dir())
    assert not warnings, "\n".join(warnings)
    assert b"amdgcn-amd-amdhsa--gfx90a" in obj, "no gfx90a code object in kernel.cu.o"
    for kernel in _expected_kernels(*item):
        assert kernel.encode() in obj, f"{kernel} missing from the gfx90a object"


def _reject_host_tensors(family: str, params: dict, module) -> None:
    """Every export refuses CPU tensors with the binding's named device error."""
    z = torch.zeros(2, dtype=torch.int64)
    if family == "plan":
        out = torch.empty((2, 16), dtype=torch.uint8)
        with pytest.raises(ValueError, match="out: expected a rocm tensor, got one on cpu:0"):
            if params["online"]:
                module.decode(out, z, z, 0)
            else:
                module.decode(out, z, torch.zeros((1, 1), dtype=torch.int32), torch.zeros(1, dtype=torch.int64),
                              z, 256, 8, False)
    elif family == "compress":
        x = torch.zeros(1)
        with pytest.raises(ValueError, match="kv_score_buffer: expected a rocm tensor, got one on cpu:0"):
            if params["store"] == "none":
                module.compress(x, x, x, x, x, x, True)
            else:
                module.compress_store(x, x, x, x, x, x, x, z, x, 1e-6, 64, True)
    else:
        x = torch.zeros(1)
        with pytest.raises(ValueError, match="kv: expected a rocm tensor, got one on cpu:0"):
            module.forward(x, x, x, 1e-6, x, z, x, 64, True, 4)


@requires_hipcc
@pytest.mark.parametrize("item", VARIANTS, ids=VARIANT_IDS)
def test_variant_builds_for_gfx90a(gfx90a_engine, item) -> None:
    """Kernel TU (hipcc), binding TU (host compiler, HIP headers), link (libamdhip64), load."""
    import json

    from flashcompress.jit import acquire, get_family

    family, params = item
    result = gfx90a_engine[_variant_id(item)]
    assert result.status != "failed", f"{result.key.describe()}: {result.error}"
    fam = get_family(family)
    acquired = acquire(result.key)
    assert acquired.status in ("memo", "hit"), acquired
    module = acquired.module
    for name in fam.exports:
        assert module.implements_function(name), f"{result.key.describe()} lacks {name}"
    if family == "plan":
        from flashcompress.cuda_ops import plans as plan_builder

        info = plan_builder.layout_info(module=module)
        assert info["ratio"] == params["ratio"] and info["online"] == params["online"]
        for layout in (L.DECODE_PLAN, L.COMPRESS_PLAN, L.WRITE_PLAN):
            assert info[layout.name]["size"] == layout.row_bytes
            assert info[layout.name]["fields"] == {f.name: [f.offset, f.size] for f in layout.fields}
        assert bytes.fromhex(info["invalid_compress_row"]) == L.INVALID_COMPRESS_ROW
        assert bytes.fromhex(info["invalid_write_row"]) == L.INVALID_WRITE_ROW
    if family == "store":
        info = json.loads(str(module.format_info()))
        assert info["name"] == params["fmt"] and info["head_dim"] == params["head_dim"]
        assert module.page_bytes(64) == L.select_cache_format(params["head_dim"], params["fmt"] == "idx_fp4",
                                                              params["fmt"] == "bf16").page_bytes(64)
    _reject_host_tensors(family, params, module)


@requires_hipcc
def test_selftest_builds_through_the_engine_for_hip(private_env) -> None:
    """The engine's own family uses the same shim (gpu_runtime.h) and binds kDLROCM on HIP."""
    from flashcompress.jit import make_key, acquire

    key = make_key("selftest", target=HIP_TARGET, value=3, block=128)
    built = acquire(key)
    assert built.status == "built", built
    x = torch.arange(5, dtype=torch.float32)
    out = torch.empty_like(x)
    built.module.add_value_cpu(x, out)
    assert torch.equal(out, x + 3)
    assert built.module.variant_arch() == "gfx90a"
    with pytest.raises(ValueError, match=r"expected 10\b"):  # kDLROCM
        built.module.add_value(x, out)


# ----------------------------------------------------------------------------- gfx942 (clang-19, device only)

# Hardware FP8 conversions of gfx94x (v_cvt_pk_fp8_f32, v_cvt_f32_fp8, ...): FNUZ on gfx942.
_HW_FP8 = re.compile(r"\bv_cvt_\w*(fp8|bf8)\w*")


@requires_clang19
@pytest.mark.parametrize("item", VARIANTS, ids=VARIANT_IDS)
def test_kernel_device_code_compiles_for_gfx942(gfx942_device, item) -> None:
    from flashcompress.jit.render import kernel_include_dir

    command, rc, output, asm = gfx942_device[_variant_id(item)]
    assert rc == 0, f"clang++-19 failed for gfx942: {first_error(output)}\n$ {command}"
    warnings = own_warnings(output, kernel_include_dir())
    assert not warnings, "\n".join(warnings)
    assert '.amdgcn_target "amdgcn-amd-amdhsa--gfx942"' in asm
    for kernel in _expected_kernels(*item):
        assert re.search(rf"^\s*\.globl\s+\S*{kernel}", asm, re.M), f"{kernel} missing from the gfx942 ISA"
    hw = sorted(set(m.group(0) for m in _HW_FP8.finditer(asm)))
    assert not hw, f"hardware FP8 (FNUZ on gfx942) conversions in the ISA: {hw}"


# ----------------------------------------------------------------------------- quant.cuh on HIP

_QUANT_PROBE = r"""
// Device passes of HIP builds take quant.cuh's portable branches, the ones the host tests check.
#include <type_traits>

#include "quant.cuh"
#include "vec.cuh"

#if !FC_GPU_HIP
#error "compiled without __HIP_PLATFORM_AMD__"
#endif
#if defined(__HIP_DEVICE_COMPILE__)
#if defined(__CUDA_ARCH__)
#error "__CUDA_ARCH__ in a HIP device pass: quant.cuh would take its CUDA branches"
#endif
static_assert(FC_QUANT_HW_E4M3 == 0, "HIP device code must use the software e4m3 path");
#endif
static_assert(sizeof(flashcompress::bf16_t) == 2 && alignof(flashcompress::bf16_t) == 2, "bf16 is 2 bytes");
static_assert(std::is_same_v<decltype(flashcompress::bf16_t{}.bits), uint16_t>, "bf16_t is our own bit pattern");

namespace q = flashcompress::quant;

__global__ void quant_probe(const float* x, uint32_t* out) {
  const int t = threadIdx.x;
  const float* v = x + 4 * t;
  out[3 * t] = q::pack_fp8x4(v[0], v[1], v[2], v[3]);
  out[3 * t + 1] = q::e2m1_threshold(v[0]) | (q::ue8m0_ceil(v[1]) << 8);
  out[3 * t + 2] = flashcompress::from_float<flashcompress::bf16_t>(v[2]).bits |
                   (q::bf16_bits(flashcompress::to_float(flashcompress::bf16_t{q::bf16_bits(v[3])})) << 16);
}
"""


def _quant_probe_dir(tmp_path: Path) -> Path:
    (tmp_path / "quant_probe.cu").write_text(_QUANT_PROBE)
    return tmp_path


@requires_hipcc
def test_quant_software_path_on_gfx90a(tmp_path: Path) -> None:
    from flashcompress.jit.flags import BASE_HIP_FLAGS
    from flashcompress.jit.render import kernel_include_dir

    work = _quant_probe_dir(tmp_path)
    argv = [str(_find_hipcc()), *BASE_HIP_FLAGS, "-Wall", "-Wextra", "--offload-arch=gfx90a",
            f"-I{kernel_include_dir()}", "-c", "-x", "hip", "quant_probe.cu", "-o", "quant_probe.o"]
    rc, out = _run(argv, work, {"HIP_PLATFORM": "amd"})
    assert rc == 0, f"{first_error(out)}\n$ {' '.join(argv)}"
    assert b"amdgcn-amd-amdhsa--gfx90a" in (work / "quant_probe.o").read_bytes()


@requires_clang19
def test_quant_software_path_on_gfx942(tmp_path: Path) -> None:
    from flashcompress.jit.flags import BASE_HIP_FLAGS
    from flashcompress.jit.render import kernel_include_dir

    work = _quant_probe_dir(tmp_path)
    argv = [_find_clang19(), "-x", "hip", f"--rocm-path={_rocm_headers_root()}", "-nogpulib",
            "--offload-device-only", "-S", *BASE_HIP_FLAGS, "-Wall", "-Wextra", "--offload-arch=gfx942",
            f"-I{kernel_include_dir()}", "quant_probe.cu", "-o", "quant_probe.s"]
    rc, out = _run(argv, work)
    assert rc == 0, f"{first_error(out)}\n$ {' '.join(argv)}"
    asm = (work / "quant_probe.s").read_text()
    assert "quant_probe" in asm and not _HW_FP8.search(asm)
