"""The ``store`` JIT family on a machine without a GPU.

* ``jit_kernel/quant.cuh`` compiled by the plain host compiler (no CUDA headers) agrees bit
  for bit with ``torch_backend/quant.py`` (and with torch's own bf16 / float8_e4m3fn casts)
  over a dense grid of fp32 patterns: every sign/exponent/top-11-mantissa-bit combination
  with six low-bit patterns (zero, subnormals, ties, saturation, NaN / Inf all included).
* The store kernel's row code (``store_plan_row`` -> ``store_row``) runs on the CPU in
  tests/native/store_host_emulator.cu (32 threads as the 32 lanes, host shuffles) and its
  cache bytes match the PyTorch backend on random decode / prefill calls for every format
  (the V4.1 layouts of ``layout=`` included) and row dtype, and the SGLang golden vectors
  byte for byte.
* The family registers with the expected space and presets; every variant renders thin
  sources, compiles for sm_90a through the JIT engine, loads, and its C++ format constants
  agree with ``flashcompress.layouts``; the binding rejects host tensors with a named error.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import torch

from _golden import load_golden
from _jit_helpers import REPO, requires_nvcc
from _store_cases import FORMATS, StoreCase, compare_store, make_case, reference_cache
from flashcompress import layouts as L
from flashcompress.torch_backend import quant as Q

NATIVE = REPO / "tests" / "native"
INCLUDE = REPO / "jit_kernel"
ALL_VARIANTS = [
    {"head_dim": 512, "fmt": "v4", "dtype": "f32"},
    {"head_dim": 512, "fmt": "v4", "dtype": "bf16"},
    {"head_dim": 512, "fmt": "bf16", "dtype": "f32"},
    {"head_dim": 512, "fmt": "bf16", "dtype": "bf16"},
    {"head_dim": 128, "fmt": "idx_fp8", "dtype": "f32"},
    {"head_dim": 128, "fmt": "idx_fp8", "dtype": "bf16"},
    {"head_dim": 128, "fmt": "idx_fp4", "dtype": "f32"},
    {"head_dim": 128, "fmt": "idx_fp4", "dtype": "bf16"},
]
V4_VARIANTS = list(ALL_VARIANTS)  # built here; the V4.1 layouts' variants: test_v41_store_layouts.py
ALL_VARIANTS += [{"head_dim": 512, "fmt": layout, "dtype": dtype}
                 for layout in ("v41", "v41_fp4", "uniform_fp8", "v41_new", "v41_fp4_new") for dtype in ("f32", "bf16")]
PRESETS = [ALL_VARIANTS[0], ALL_VARIANTS[4], ALL_VARIANTS[6]]


def _nvcc() -> Path:
    cuda_home = Path(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda")
    return cuda_home / "bin" / "nvcc"


# ----------------------------------------------------------------------------- quant.cuh on the host


@pytest.fixture(scope="module")
def quant_host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cxx = shutil.which(os.environ.get("CXX") or "c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    exe = tmp_path_factory.mktemp("quant_host") / "store_quant_host"
    cmd = [cxx, "-std=c++17", "-O2", "-Wall", "-Wextra", f"-I{INCLUDE}", str(NATIVE / "store_quant_host.cpp"),
           "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}\n{res.stderr}"
    assert "warning" not in res.stderr, res.stderr
    return exe


def dense_fp32_grid() -> torch.Tensor:
    """Every (sign, exponent, top 11 mantissa bits) with low 12 bits in {0, 1, 0x7FF, 0x800, 0x801, 0xFFF}."""
    high = torch.arange(1 << 20, dtype=torch.int64) << 12
    low = torch.tensor([0x000, 0x001, 0x7FF, 0x800, 0x801, 0xFFF], dtype=torch.int64)
    bits = (high[:, None] | low[None, :]).reshape(-1)
    bits = torch.where(bits >= 1 << 31, bits - (1 << 32), bits).to(torch.int32)
    return bits.view(torch.float32)


def _first_bad(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, what: str) -> str:
    bad = (got != want).nonzero().flatten()
    if bad.numel() == 0:
        return ""
    i = int(bad[0])
    xb = int(x[i : i + 1].view(torch.int32)) & 0xFFFFFFFF
    return f"{what}: {bad.numel()} differ; first x = {float(x[i])!r} (0x{xb:08x}): got {int(got[i])}, want {int(want[i])}"


def test_quant_cuh_matches_torch_reference_bit_for_bit(quant_host: Path, tmp_path: Path) -> None:
    x = dense_fp32_grid()
    assert x.numel() % 4 == 0
    _write_tensor(tmp_path / "in.bin", x)
    res = subprocess.run([str(quant_host), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    raw = torch.frombuffer(bytearray((tmp_path / "out.bin").read_bytes()), dtype=torch.uint8)
    n = x.numel()
    rec = raw[: 12 * n].reshape(n, 12)
    inv_bits = raw[12 * n :].view(torch.int32)

    problems = []
    bf16 = rec[:, 0:2].contiguous().view(torch.int16).reshape(-1)
    problems.append(_first_bad(bf16, Q.bf16_bits(x), x, "bf16_bits"))
    finite = ~torch.isnan(x)
    torch_bf16 = x.to(torch.bfloat16).view(torch.int16)
    problems.append(_first_bad(bf16[finite], torch_bf16[finite], x[finite], "bf16_bits vs torch .to(bfloat16)"))
    problems.append(_first_bad(rec[:, 2], Q.e4m3_codes(x, clip=False), x, "e4m3_code (no clip)"))
    packed = Q.e4m3_codes(x, clip=True)
    problems.append(_first_bad(rec[:, 3], packed, x, "pack_fp8"))
    problems.append(_first_bad(rec[:, 4], packed, x, "pack_fp8x4"))
    torch_fp8 = Q.clip448(x).to(torch.float8_e4m3fn).view(torch.uint8)
    problems.append(_first_bad(rec[:, 3], torch_fp8, x, "pack_fp8 vs torch float8_e4m3fn(clip448(x))"))
    problems.append(_first_bad(rec[:, 5], Q.e2m1_threshold_codes(x), x, "e2m1_threshold"))
    xb = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    pos_normal = (xb >= 0x00800000) & (xb < 0x7F800000)
    ue = Q.ue8m0_ceil(x[pos_normal]).to(torch.int64) & 0xFF
    problems.append(_first_bad(rec[pos_normal, 6].to(torch.int64), ue, x[pos_normal], "ue8m0_ceil"))
    clip = rec[:, 8:12].contiguous().view(torch.int32).reshape(-1)
    problems.append(_first_bad(clip, Q.clip448(x).view(torch.int32), x, "clip448"))
    e = torch.arange(1, 254)
    problems.append(_first_bad(inv_bits[1:254], Q.inv_ue8m0(e).view(torch.int32), e.float(), "inv_ue8m0"))
    assert not any(problems), "\n".join(p for p in problems if p)
    # the grid really holds the interesting cases
    assert bool(torch.isnan(x).any()) and bool(torch.isinf(x).any())
    assert int((packed == 0x7E).sum()) > 0 and int(((xb & 0x7F800000) == 0).sum()) > 0


def _write_tensor(path: Path, t: torch.Tensor) -> None:
    """Raw little-endian bytes of a CPU tensor (no numpy needed)."""
    t = t.detach().cpu().contiguous()
    path.write_bytes(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))


# ----------------------------------------------------------------------------- store_row on the host


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Path:
    nvcc = _nvcc()
    if not nvcc.exists():
        pytest.skip(f"nvcc not found at {nvcc}")
    exe = tmp_path_factory.mktemp("store_emulator") / "store_host_emulator"
    cmd = [str(nvcc), "-std=c++17", "-O2", "-Xcompiler=-Wall,-Wextra,-pthread", f"-I{INCLUDE}",
           str(NATIVE / "store_host_emulator.cu"), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"emulator build failed:\n{' '.join(cmd)}\n{res.stdout}\n{res.stderr}"
    assert "warning" not in (res.stdout + res.stderr), res.stdout + res.stderr
    return exe


def emulate(exe: Path, workdir: Path, case: StoreCase, slice_dims: int = 0) -> torch.Tensor:
    """The emulated kernel's cache after the store of ``case`` (``slice_dims`` 64 / 128: the
    compress kernel's cluster store, each slice's block stored on its own)."""
    workdir.mkdir(parents=True, exist_ok=True)
    dtype = "f32" if case.kv.dtype == torch.float32 else "bf16"
    weight = case.norm_weight.to(case.kv.dtype)  # what cuda_ops.store passes
    freq = torch.view_as_real(case.freq_cis).flatten(-2).contiguous()
    eps_bits = struct.unpack("<I", struct.pack("<f", case.norm_eps))[0]
    (workdir / "params.txt").write_text(
        f"{case.fmt.name} {dtype} {case.kv.shape[0]} {case.ratio} {int(case.is_decode)} {case.page_size} "
        f"{eps_bits} {freq.shape[0]} {case.out_loc.numel()} {case.cache.numel()} {slice_dims}\n")
    for name, t in (("kv", case.kv), ("plan", case.plan), ("out_loc", case.out_loc), ("weight", weight),
                    ("freq", freq), ("cache", case.cache)):
        _write_tensor(workdir / f"{name}.bin", t)
    res = subprocess.run([str(exe), str(workdir)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"emulator failed: {res.stderr}"
    out = bytearray((workdir / "cache_out.bin").read_bytes())
    return torch.frombuffer(out, dtype=torch.uint8).reshape(case.cache.shape).clone()


CASES = [(fmt, dtype, decode) for fmt in FORMATS for dtype in ("f32", "bf16") for decode in (True, False)]


@pytest.mark.parametrize("fmt,dtype,decode", CASES, ids=[f"{f}-{d}-{'decode' if m else 'prefill'}" for f, d, m in CASES])
def test_emulated_store_matches_torch(emulator: Path, tmp_path: Path, fmt: str, dtype: str, decode: bool) -> None:
    torch_dtype = torch.float32 if dtype == "f32" else torch.bfloat16
    ratio = 128 if fmt == "v4" and not decode else 4
    page_size = 2 if ratio == 128 else 4
    case = make_case(fmt, torch_dtype, decode, rows=24, ratio=ratio, page_size=page_size,
                     seed=CASES.index((fmt, dtype, decode)))
    valid, _, _ = case.targets()
    assert 0 < int(valid.sum()) < case.kv.shape[0], "the case needs stored and skipped rows"
    want = reference_cache(case)
    got = emulate(emulator, tmp_path, case)
    cmp = compare_store(got, want, case.cache, case)
    print(f"{fmt}/{dtype}/{'decode' if decode else 'prefill'}: {cmp.report()}")
    assert cmp.ok, cmp.report()
    # poisoned bytes outside the entries, and something was written
    assert not torch.equal(got, case.cache)


SLICED = [(fmt, dtype, dims) for fmt in ("v4", "bf16") for dtype in ("f32", "bf16") for dims in (64, 128)]


@pytest.mark.parametrize("fmt,dtype,dims", SLICED, ids=[f"{f}-{d}-slice{n}" for f, d, n in SLICED])
def test_emulated_sliced_store_matches_torch_and_the_whole_row_store(emulator: Path, tmp_path: Path, fmt: str,
                                                                     dtype: str, dims: int) -> None:
    """The sliced stores of the compress kernel (store_slice per 64 / 128-dim block, the row's
    norm from the slices' partial sums added in slice order): the C128 cluster epilogue (64 / 128)
    and the one-block head-512 store of C4 and online decode (128, a warp per block) write the
    reference bytes, and the same bytes as the one-warp store_row."""
    torch_dtype = torch.float32 if dtype == "f32" else torch.bfloat16
    case = make_case(fmt, torch_dtype, True, rows=24, ratio=128, page_size=2, seed=100 + SLICED.index((fmt, dtype, dims)))
    valid, _, _ = case.targets()
    assert 0 < int(valid.sum()) < case.kv.shape[0], "the case needs stored and skipped rows"
    got = emulate(emulator, tmp_path / "sliced", case, dims)
    cmp = compare_store(got, reference_cache(case), case.cache, case)
    print(f"{fmt}/{dtype}/slice {dims}: {cmp.report()}")
    assert cmp.ok, cmp.report()
    assert not torch.equal(got, case.cache)
    assert torch.equal(got, emulate(emulator, tmp_path / "whole", case))


def test_emulator_rejects_a_sliced_indexer_store(emulator: Path, tmp_path: Path) -> None:
    case = make_case("idx_fp8", torch.float32, True, rows=4, ratio=4, page_size=4, seed=0)
    with pytest.raises(AssertionError, match="not a sliced store"):
        emulate(emulator, tmp_path, case, 64)


GOLDEN = ["store_v4_c4_p64.pt", "store_v4_c128_p2.pt", "store_idx_fp8_p64.pt", "store_idx_fp4_p64.pt",
          "store_bf16_c4_p1.pt"]


@pytest.mark.parametrize("call", ["decode", "prefill"])
@pytest.mark.parametrize("name", GOLDEN)
def test_emulated_store_matches_golden(emulator: Path, tmp_path: Path, name: str, call: str) -> None:
    d = load_golden(f"store/{name}")
    fmt = L.select_cache_format(d["head_dim"], d["use_fp4"], d["bf16_store"])
    case = StoreCase(fmt, d[f"{call}.is_decode"], d["compress_ratio"], d["page_size"], d[f"{call}.kv"],
                     d[f"{call}.plan"], d[f"{call}.out_loc"], d["norm_weight"], d["norm_eps"], d["freq_cis"],
                     d["kvcache_before"])
    got = emulate(emulator, tmp_path, case)
    want = d[f"{call}.kvcache_after"]
    cmp = compare_store(got, want, case.cache, case, exact=True)
    assert cmp.ok and torch.equal(got, want), cmp.report()


def test_comparison_catches_differences() -> None:
    """compare_store flags a changed poison byte, a scale byte and a two-step code (it can fail)."""
    case = make_case("v4", torch.float32, True, rows=8, seed=3)
    want = reference_cache(case)
    assert compare_store(want, want, case.cache, case).ok
    valid, dest, _ = case.targets()
    r = int(valid.nonzero()[0])
    loc = int(dest[r])
    page_bytes = case.cache.shape[1]
    base = (loc // case.page_size) * page_bytes
    data0 = base + (loc % case.page_size) * 576
    scale0 = base + case.page_size * 576 + (loc % case.page_size) * 8
    for offset, delta in ((scale0, 1), (data0 + 5, 2), (scale0 + 7, 1)):
        bad = want.clone().reshape(-1)
        bad[offset] = (int(bad[offset]) + delta) % 256
        assert not compare_store(bad.reshape(want.shape), want, case.cache, case).ok, offset
    one_step = want.clone().reshape(-1)
    one_step[data0 + 5] = (int(one_step[data0 + 5]) & 0x80) | ((int(one_step[data0 + 5]) & 0x7F) ^ 1)
    res = compare_store(one_step.reshape(want.shape), want, case.cache, case)
    assert res.code_mismatches == 1 and not res.problems


# ----------------------------------------------------------------------------- family and builds


def test_store_family_registration() -> None:
    from flashcompress.cuda_ops import store
    from flashcompress.jit import get_family

    fam = get_family("store")
    assert fam is store.STORE
    assert fam.exports == ("forward", "forward_checked", "page_bytes", "format_info")
    assert sorted(map(str, fam.expand())) == sorted(map(str, ALL_VARIANTS))
    for model in ("deepseek-v4-flash", "deepseek-v4-pro"):
        assert fam.preset_params(model) == PRESETS
    with pytest.raises(ValueError, match="head_dim"):
        fam.check_params({"head_dim": 128, "fmt": "v4", "dtype": "f32"})
    assert fam.warmup is not None


def test_signature_matches_torch_backend() -> None:
    import inspect

    from flashcompress.cuda_ops import store
    from flashcompress.torch_backend import ops

    assert inspect.signature(store.compress_norm_rope_store) == inspect.signature(ops.compress_norm_rope_store)


def _variant_key(params: dict):
    """The sm_90a key of a store variant (``jit.make_key``, or ``VariantKey.make`` before it existed)."""
    import flashcompress.jit as jit

    if hasattr(jit, "make_key"):
        return jit.make_key("store", target="cuda:9.0a", **params)
    return jit.VariantKey.make("store", target="cuda:9.0a", **params)


@pytest.mark.parametrize("params", ALL_VARIANTS, ids=lambda p: f"{p['fmt']}_{p['dtype']}")
def test_rendered_sources_are_thin(params) -> None:
    from flashcompress.jit import get_family
    from flashcompress.jit.render import render_sources

    import flashcompress.cuda_ops.store  # noqa: F401  (registers the family)

    key = _variant_key(params)
    src = render_sources(key, get_family("store"))
    kernel, binding = src["kernel.cu"], src["binding.cpp"]
    assert "tvm/ffi" not in kernel and "__global__" not in kernel
    assert "template struct ::flashcompress::StoreLaunch<" in kernel
    assert len([ln for ln in kernel.splitlines() if ln.strip() and not ln.startswith("//")]) <= 6
    for name in ("forward", "page_bytes", "format_info"):
        assert f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}, {key.module_name}::{name});" in binding
    assert "quant_probe" not in binding and "quant_probe" not in kernel  # a test probe: the selftest family


@requires_nvcc
def test_store_variants_build_load_and_match_layouts(jit_env) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from flashcompress.cuda_ops import store
    from flashcompress.jit import get_module

    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        modules = list(pool.map(lambda p: get_module("store", **p), V4_VARIANTS))
    for params, mod in zip(V4_VARIANTS, modules):
        for name in store.EXPORTS:
            assert mod.implements_function(name), f"store {params} lacks {name}"
        info = json.loads(str(mod.format_info()))
        fmt = L.select_cache_format(params["head_dim"], params["fmt"] == "idx_fp4", params["fmt"] == "bf16")
        assert info == {"name": fmt.name, "head_dim": fmt.head_dim, "data_bytes": fmt.data_bytes,
                        "scale_bytes": fmt.scale_bytes, "page_align": fmt.page_align, "row_dtype": params["dtype"]}
        for page_size in (1, 2, 4, 64, 256):
            assert mod.page_bytes(page_size) == fmt.page_bytes(page_size), (fmt.name, page_size)


@requires_nvcc
def test_binding_rejects_host_tensors(jit_env) -> None:
    from flashcompress.cuda_ops import store
    from flashcompress.jit import clear_memo

    clear_memo()
    mod = store.store_module(L.INDEXER_FP8, torch.float32)
    kv = torch.zeros((2, 128))
    args = (kv, torch.zeros((2, 16), dtype=torch.uint8), torch.ones(128), 1e-6, torch.zeros((8, 64)),
            torch.zeros(2, dtype=torch.int64), torch.zeros((1, 132 * 4), dtype=torch.uint8), 4, True, 4)
    with pytest.raises(ValueError, match="kv: expected a cuda tensor, got one on cpu:0"):
        mod.forward(*args)
    clear_memo()


def test_freq_table_is_the_table_itself_and_follows_it() -> None:
    """What the CUDA backends pass the bindings for freq_cis: the complex64 table itself when it is
    contiguous (the bindings read it as its fp32 [T, 64] bytes; no view per call), else a contiguous
    fp32 copy; never kept."""
    import gc
    import weakref

    from flashcompress.cuda_ops.store import freq_table

    freq = torch.polar(torch.ones(6, 32), torch.arange(192, dtype=torch.float32).view(6, 32))
    got = freq_table(freq)
    assert got is freq and torch.equal(got.view(torch.float32), torch.view_as_real(freq).flatten(-2))
    other = torch.polar(torch.ones(3, 32), torch.zeros(3, 32))
    freq.set_(other)  # storage swapped in place: still the table itself
    assert freq_table(freq).shape == (3, 32) and freq_table(freq).data_ptr() == other.data_ptr()
    strided = torch.polar(torch.ones(6, 64), torch.ones(6, 64))[:, ::2]  # not contiguous: a contiguous copy
    copy = freq_table(strided)
    assert copy.dtype == torch.float32 and copy.is_contiguous()
    assert torch.equal(copy, torch.view_as_real(strided).flatten(-2))
    # Nothing keeps a table alive (a CUDA-graph pool tensor must die with its graph).
    table = torch.polar(torch.ones(2, 32), torch.zeros(2, 32))
    ref = weakref.ref(table)
    freq_table(table)
    del table, got
    gc.collect()
    assert ref() is None, "freq_table kept a reference to the table"
