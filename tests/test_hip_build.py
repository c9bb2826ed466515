"""HIP compile checks of the ``plan`` family (``pytest -m nvcc``; nothing runs on an AMD GPU).

Everywhere (no HIP toolchain needed):
* the kernel headers and templates spell the GPU runtime only through jit_kernel/gpu_runtime.h
  (no ``cuda*`` runtime names, no ``<cuda_runtime.h>``) and use no 32-lane warp intrinsics;
* a ``hip:`` target renders ``kDLROCM`` and the backend static_asserts, and the engine's HIP
  command lines define ``__HIP_PLATFORM_AMD__`` for both TUs (what gpu_runtime.h keys on).

Where ``hipcc`` exists (skipped cleanly otherwise, as in CI; Debian's ``apt-get install hipcc``
(HIP 5.2.3) is enough, see ../shared/spec/hip.md):
* every plan variant's ``kernel.cu``, rendered for ``hip:gfx90a`` by the engine, compiles with
  the engine's exact hipcc command (``HIP_PLATFORM=amd``, ``-x hip``, ``--offload-arch``) plus
  ``-Wall -Wextra``, with no warning from our code, into an object carrying gfx90a code;
* every variant builds end to end through the engine (binding TU with the host compiler and the
  HIP headers, link against libamdhip64), loads on this GPU-less machine, its C++ layouts match
  ``flashcompress.layouts``, host tensors are rejected as not being ``rocm`` tensors, and a
  second lookup is a cache hit.
gfx90a (MI200) because HIP 5.2's clang 15 does not know gfx942.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from flashcompress import layouts as L

pytestmark = pytest.mark.nvcc  # CPU-only compiler build checks (pyproject has no hipcc marker)

HIP_TARGET = "hip:gfx90a"
PLAN_VARIANTS = [
    {"ratio": 4, "online": False},
    {"ratio": 128, "online": False},
    {"ratio": 128, "online": True},
]


def _variant_id(params: dict) -> str:
    return f"r{params['ratio']}_online{int(params['online'])}"


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


requires_hipcc = pytest.mark.skipif(hip_toolchain_missing() is not None, reason=str(hip_toolchain_missing()))

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


# ----------------------------------------------------------------------------- sources (no hipcc)

# CUDA runtime spellings that must go through gpu_runtime.h, and 32-lane warp intrinsics that
# break or do not exist on wave64 / HIP 5.2.
_CUDA_RUNTIME = re.compile(r"\bcuda[A-Z]\w*|cuda_runtime|hip_runtime|CUDADeviceGuard|TVM_FFI_CHECK_CUDA_ERROR")
_WARP_32 = re.compile(r"__shfl\w*_sync|__syncwarp|__activemask|__ballot_sync|__any_sync|__all_sync")
_SHIMMED_FILES = ["plan.cuh", "plan_builder.cuh", "plan_binding.h", "selftest.cuh"]
_SHIMMED_TEMPLATES = ["plan_kernel.cu.j2", "plan_binding.cpp.j2", "selftest_kernel.cu.j2",
                      "selftest_binding.cpp.j2", "selftest_config.h.j2"]


def _code_only(text: str) -> str:
    """Drop // comments (our headers use no block comments)."""
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def test_kernel_sources_use_the_runtime_shim() -> None:
    from flashcompress.jit.render import kernel_include_dir, template_dir

    files = [kernel_include_dir() / n for n in _SHIMMED_FILES] + [template_dir() / n for n in _SHIMMED_TEMPLATES]
    for path in files:
        code = _code_only(path.read_text())
        cuda_names, warp_32 = _CUDA_RUNTIME.findall(code), _WARP_32.findall(code)
        assert not cuda_names, f"{path.name}: use the gpu_runtime.h names, not {cuda_names}"
        assert not warp_32, f"{path.name}: warp intrinsics that assume 32 lanes: {warp_32}"
    shim = (kernel_include_dir() / "gpu_runtime.h").read_text()
    for name in ("gpuError_t", "gpuStream_t", "gpuSuccess", "gpuGetLastError", "gpuGetErrorString",
                 "<hip/hip_runtime.h>", "<cuda_runtime.h>", "__HIP_PLATFORM_AMD__", "kMaxWarpSize"):
        assert name in shim, f"gpu_runtime.h lacks {name}"


@pytest.mark.parametrize("params", PLAN_VARIANTS, ids=_variant_id)
def test_hip_render(private_env, params) -> None:
    from flashcompress.jit import VariantKey, make_key, get_family
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


def test_hip_command_lines_select_the_hip_runtime(private_env) -> None:
    """gpu_runtime.h picks HIP from __HIP_PLATFORM_AMD__: both TUs of a HIP variant must define it."""
    from flashcompress.jit import VariantKey, make_key, build, get_family
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
    cuda = make_key("plan", target="cuda:9.0a", ratio=4, online=False)
    tc_cuda = Toolchain("cuda", Path("/cuda"), Path("/cuda/bin/nvcc"), Path("/usr/bin/c++"), "nvcc x", "c++ y")
    compiles, _ = build.plan_steps(cuda, get_family("plan"), tc_cuda, tvm, ["kernel.cu", "binding.cpp"],
                                   Path("/jk"), "m.so", Path("/leaf"))
    assert not any("__HIP_PLATFORM" in a or a == "-DUSE_ROCM" for s in compiles for a in s.argv)


# ----------------------------------------------------------------------------- hipcc builds


@requires_hipcc
@pytest.mark.parametrize("params", PLAN_VARIANTS, ids=_variant_id)
def test_plan_kernel_tu_compiles_with_hipcc(private_env, tmp_path: Path, params) -> None:
    from flashcompress.jit import VariantKey, make_key, build, get_family
    from flashcompress.jit.render import kernel_include_dir, render_sources
    from flashcompress.jit.toolchain import TvmFfiInfo, get_toolchain

    key = make_key("plan", target=HIP_TARGET, **params)
    fam = get_family("plan")
    sources = render_sources(key, fam)
    for name, text in sources.items():
        (tmp_path / name).write_text(text)
    toolchain = get_toolchain("hip", None)
    unused_tvm = TvmFfiInfo("0", (), tmp_path, "tvm_ffi")  # the kernel TU sees no tvm-ffi
    compiles, _ = build.plan_steps(key, fam, toolchain, unused_tvm, list(sources), kernel_include_dir(),
                                   "module.so", tmp_path)
    step = next(s for s in compiles if s.label == "compile kernel.cu")
    argv = [step.argv[0], "-Wall", "-Wextra", *step.argv[1:]]
    res = subprocess.run(argv, cwd=tmp_path, env=dict(os.environ, **step.env), capture_output=True, text=True,
                         timeout=600)
    output = res.stdout + res.stderr
    assert res.returncode == 0, f"{step.command}\n{output}"
    assert not own_warnings(output, kernel_include_dir()), output
    obj = (tmp_path / "kernel.cu.o").read_bytes()
    assert b"amdgcn-amd-amdhsa--gfx90a" in obj, "no gfx90a code object in kernel.cu.o"
    kernels = ["online_decode_kernel", "online_stage1_kernel", "online_prefill_rows_kernel"] if params["online"] \
        else ["decode_kernel", "prefill_stage1_kernel", "prefill_rows_kernel"]
    for kernel in [*kernels, "prefill_scan_kernel"]:
        assert kernel.encode() in obj, f"{kernel} missing from the gfx90a object"


@requires_hipcc
def test_plan_variants_build_through_the_engine_for_hip(private_env) -> None:
    from flashcompress.cuda_ops import plans as plan_builder
    from flashcompress.jit import VariantKey, make_key, acquire, engine

    z = torch.zeros(2, dtype=torch.int64)
    for params in PLAN_VARIANTS:
        key = make_key("plan", target=HIP_TARGET, **params)
        first = acquire(key)
        assert first.status == "built", first
        for name in plan_builder.EXPORTS:
            assert first.module.implements_function(name), f"{key.describe()} lacks {name}"
        info = plan_builder.layout_info(module=first.module)
        assert info["ratio"] == params["ratio"] and info["online"] == params["online"]
        for layout in (L.DECODE_PLAN, L.COMPRESS_PLAN, L.WRITE_PLAN):
            assert info[layout.name]["size"] == layout.row_bytes
            assert info[layout.name]["fields"] == {f.name: [f.offset, f.size] for f in layout.fields}
        assert bytes.fromhex(info["invalid_compress_row"]) == L.INVALID_COMPRESS_ROW
        assert bytes.fromhex(info["invalid_write_row"]) == L.INVALID_WRITE_ROW
        out = torch.empty((2, 16), dtype=torch.uint8)
        with pytest.raises(ValueError, match="out: expected a rocm tensor, got one on cpu:0"):
            if params["online"]:
                first.module.decode(out, z, z, 0)
            else:
                first.module.decode(out, z, torch.zeros((1, 1), dtype=torch.int32), torch.zeros(1, dtype=torch.int64),
                                    z, 256, 8, False)
        engine.clear_memo("plan")
        assert acquire(key).status == "hit"


@requires_hipcc
def test_selftest_builds_through_the_engine_for_hip(private_env) -> None:
    """The engine's own family uses the same shim (gpu_runtime.h) and binds kDLROCM on HIP."""
    from flashcompress.jit import VariantKey, make_key, acquire

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
