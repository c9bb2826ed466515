"""The ``plan`` JIT family on a machine without a GPU (``pytest -m nvcc``).

* The family is registered with the expected exports, parameter space and presets.
* Every preset variant renders, compiles for sm_90a with the real nvcc through the JIT
  engine, loads, exports every function, and its C++ layouts (``layout_info``, a host
  function) agree with ``flashcompress.layouts``; a second load compiles nothing.
* Both TUs of every variant compile with -Wall -Wextra (nvcc: on the host side) without a
  warning from our code (jit_kernel/ and the rendered sources). The HIP counterparts of these
  build checks are in test_hip_build.py.
* The kernel logic itself runs on the CPU: tests/native/plan_host_emulator.cu calls the
  exact ``__host__ __device__`` per-row functions of jit_kernel/plan_builder.cuh in a loop
  over the thread index (the scan kernel replaced by a serial scan), and its bytes are
  compared with the PyTorch backend and with the SGLang golden vectors.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _golden import load_golden
from _jit_helpers import REPO, apply_environ, clean_environ, requires_nvcc, reset_engine
from _plan_cases import MODES, assert_plan_bytes, make_world, mode_id, random_batch, random_decode_batch
from flashcompress import layouts as L
from flashcompress.torch_backend import plans as tp
from flashcompress.torch_backend.rows import pad_rows

pytestmark = pytest.mark.nvcc

EXPECTED_VARIANTS = [
    {"ratio": 4, "online": False},
    {"ratio": 128, "online": False},
    {"ratio": 128, "online": True},
]


@pytest.fixture()
def jit_env(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The shared session cache of the JIT tests (builds made here are hits for later tests)."""
    cache = tmp_path_factory.getbasetemp() / "jit-cache-shared"
    cache.mkdir(exist_ok=True)
    env = clean_environ(cache, tmp_path / "xdg")
    apply_environ(monkeypatch, env)
    yield env
    reset_engine()


# ----------------------------------------------------------------------------- family


def test_plan_family_registration() -> None:
    from flashcompress.cuda_ops import plans as plan_builder
    from flashcompress.jit import get_family

    fam = get_family("plan")
    assert fam is plan_builder.PLAN
    assert fam.exports == ("decode", "decode_checked", "decode_alloc", "prefill_stage1", "prefill_device", "prefill_host",
                           "layout_info")
    assert [dict(v) for v in fam.expand()] == EXPECTED_VARIANTS
    for model in ("deepseek-v4-flash", "deepseek-v4-pro"):
        assert fam.preset_params(model) == EXPECTED_VARIANTS
    with pytest.raises(ValueError, match="online=True exists only for ratio 128"):
        fam.check_params({"ratio": 4, "online": True})
    with pytest.raises(ValueError):
        fam.check_params({"ratio": 8, "online": False})
    assert fam.warmup is not None


@pytest.mark.parametrize("params", EXPECTED_VARIANTS, ids=lambda p: f"r{p['ratio']}_online{int(p['online'])}")
def test_rendered_sources_are_thin(jit_env, params) -> None:
    from flashcompress.jit import VariantKey, make_key, get_family
    from flashcompress.jit.render import render_sources, template_dir

    key = make_key("plan", target="cuda:9.0a", **params)
    src = render_sources(key, get_family("plan"))
    kernel, binding = src["kernel.cu"], src["binding.cpp"]
    online = "true" if params["online"] else "false"
    # The kernel TU is one explicit instantiation of the launch struct (jit_kernel/plan_launch.h).
    assert f"template struct flashcompress::PlanLaunch<{params['ratio']}, {online}>;" in kernel
    assert len([line for line in kernel.splitlines() if line.strip()]) <= 4
    assert "tvm/ffi" not in kernel, "kernel.cu must stay free of tvm-ffi headers (nvcc compile time)"
    assert "__global__" not in kernel, "kernel bodies belong in jit_kernel/plan_builder.cuh"
    assert f"PlanBinding<{params['ratio']}, {online}>" in binding
    for name in ("decode", "decode_checked", "decode_alloc", "prefill_stage1", "prefill_device", "prefill_host",
                 "layout_info"):
        assert f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}, {key.module_name}::Binding::{name});" in binding
    for template in ("plan_kernel.cu.j2", "plan_binding.cpp.j2"):  # no regular/online split in the templates
        assert "{% if" not in (template_dir() / template).read_text()


@requires_nvcc
def test_plan_variants_build_load_and_match_layouts(jit_env) -> None:
    from flashcompress.cuda_ops import plans as plan_builder
    from flashcompress.jit import VariantKey, make_key, acquire, engine

    for params in EXPECTED_VARIANTS:
        key = make_key("plan", **params)
        assert key.target == "cuda:9.0a"
        first = acquire(key)
        assert first.status in ("built", "hit", "waited"), first
        for name in plan_builder.EXPORTS:
            assert first.module.implements_function(name), f"{key.describe()} lacks {name}"
        info = plan_builder.layout_info(module=first.module)
        assert info["ratio"] == params["ratio"] and info["online"] == params["online"]
        assert info["window"] == L.window_size(params["ratio"])
        assert info["max_ragged_id"] == L.MAX_RAGGED_ID
        for layout in (L.DECODE_PLAN, L.COMPRESS_PLAN, L.WRITE_PLAN):
            cpp = info[layout.name]
            assert cpp["size"] == layout.row_bytes and cpp["align"] == layout.row_bytes
            assert cpp["fields"] == {f.name: [f.offset, f.size] for f in layout.fields}
        assert bytes.fromhex(info["invalid_compress_row"]) == L.INVALID_COMPRESS_ROW
        assert bytes.fromhex(info["invalid_write_row"]) == L.INVALID_WRITE_ROW
        # a fresh process-level lookup is a cache hit: no compiler runs
        engine.clear_memo("plan")
        again = acquire(key)
        assert again.status == "hit", again


@requires_nvcc
def test_binding_rejects_host_tensors(jit_env) -> None:
    """Argument checks run before anything touches a GPU, so they work here too."""
    from flashcompress.cuda_ops import plans as plan_builder

    mod = plan_builder._module(4, False)
    z = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="out: expected a cuda tensor, got one on cpu:0"):
        mod.decode(torch.empty((2, 16), dtype=torch.uint8), z, torch.zeros((1, 1), dtype=torch.int32),
                   torch.zeros(1, dtype=torch.int64), z, 256, 8, False)
    online = plan_builder._module(128, True)
    with pytest.raises(ValueError, match="plan_c: expected a cuda tensor"):
        online.prefill_device(torch.empty((2, 16), dtype=torch.uint8), torch.empty((2, 16), dtype=torch.uint8),
                              torch.empty(9, dtype=torch.int64), z, z, z, 0)
    # the eager prefill planner of host lengths wants its world (the slots first) on the GPU
    r2t, f2s = torch.zeros((4, 16), dtype=torch.int32), torch.zeros(8, dtype=torch.int64)
    with pytest.raises(ValueError, match="req_pool_indices: expected a cuda tensor, got one on cpu:0"):
        mod.prefill_host(z, z, z, r2t, f2s, 256, 8, False, 2, False)
    with pytest.raises(ValueError, match="req_pool_indices: expected a cuda tensor, got one on cpu:0"):
        online.prefill_host(z, z, z, r2t, 2, False, 0)


# A warning whose primary location is one of our files: a jit_kernel/ header or a rendered TU
# (./kernel.cu, ./binding.cpp); gcc/clang ("f:12:3: warning") and nvcc front end ("f(12): warning")
# formats. tvm-ffi's own header warnings (unused parameters in its export macro) are not ours.
_WARNING = re.compile(r"^(?P<path>[^\s:()]+)(?::\d+(?::\d+)?:|\(\d+\):)\s*warning\b")


def own_warnings(output: str, include_dir: Path) -> list[str]:
    found = []
    for line in output.splitlines():
        m = _WARNING.match(line.strip())
        if m and (m.group("path").startswith("./") or "/" not in m.group("path")
                  or m.group("path").startswith(str(include_dir))):
            found.append(line)
    return found


@requires_nvcc
@pytest.mark.parametrize("params", EXPECTED_VARIANTS, ids=lambda p: f"r{p['ratio']}_online{int(p['online'])}")
def test_variant_tus_compile_without_warnings(jit_env, tmp_path: Path, params) -> None:
    from flashcompress.jit import VariantKey, make_key, build, get_family
    from flashcompress.jit.render import kernel_include_dir, render_sources
    from flashcompress.jit.toolchain import get_toolchain, tvm_ffi_info

    key = make_key("plan", target="cuda:9.0a", **params)
    fam = get_family("plan")
    sources = render_sources(key, fam)
    for name, text in sources.items():
        (tmp_path / name).write_text(text)
    compiles, _ = build.plan_steps(key, fam, get_toolchain("cuda", None), tvm_ffi_info(), list(sources),
                                   kernel_include_dir(), "module.so", tmp_path)
    procs = []
    for step in compiles:
        extra = ["-Xcompiler=-Wall,-Wextra"] if step.label == "compile kernel.cu" else ["-Wall", "-Wextra"]
        argv = [step.argv[0], *extra, *step.argv[1:]]
        procs.append((step, subprocess.Popen(argv, cwd=tmp_path, env=dict(os.environ, **step.env),
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    for step, proc in procs:
        output, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{step.command}\n{output}"
        assert not own_warnings(output, kernel_include_dir()), f"{step.label}:\n{output}"


# ----------------------------------------------------------------------------- host emulation of the kernels

EMULATOR_SRC = REPO / "tests" / "native" / "plan_host_emulator.cu"
POISON = 0xAB


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cuda_home = Path(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda")
    nvcc = cuda_home / "bin" / "nvcc"
    if not nvcc.exists():
        pytest.skip(f"nvcc not found under {cuda_home}")
    exe = tmp_path_factory.mktemp("plan_emulator") / "plan_host_emulator"
    cmd = [str(nvcc), "-std=c++17", "-O1", "-Xcompiler=-Wall,-Wextra", f"-I{REPO / 'jit_kernel'}", str(EMULATOR_SRC),
           "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"emulator build failed:\n{' '.join(cmd)}\n{res.stdout}\n{res.stderr}"
    assert not own_warnings(res.stdout + res.stderr, REPO), res.stdout + res.stderr  # no tvm-ffi here
    return exe


def _ints(t: torch.Tensor) -> str:
    return " ".join(map(str, t.reshape(-1).tolist()))


def emulate(exe: Path, op: str, ratio: int, *, rids, seq_lens, extend_lens=None, swa_page_size=256, ring_size=8,
            use_req_ring=False, state_slot_offset=0, world=None, num_rows=0, plan_c=None, num_c=0, plan_w=None,
            num_w=0) -> dict[str, torch.Tensor]:
    """Run one op of the emulator; returns {"D"|"C"|"W": uint8 [rows, bytes]}."""
    batch = rids.numel()
    if extend_lens is None:
        extend_lens = torch.zeros(batch, dtype=torch.int64)
    r2t = world.req_to_token if world is not None else torch.zeros((0, 0), dtype=torch.int32)
    f2s = world.full_to_state if world is not None else torch.zeros(0, dtype=torch.int64)
    w_bytes = 16 if op == "online_stage1" else 8
    pc = plan_c if plan_c is not None else torch.zeros((0, 16), dtype=torch.uint8)
    pw = plan_w if plan_w is not None else torch.zeros((0, w_bytes), dtype=torch.uint8)
    text = " ".join([
        op, str(ratio), str(swa_page_size), str(ring_size), str(int(use_req_ring)), str(state_slot_offset),
        str(r2t.shape[0]), str(r2t.shape[1]), _ints(r2t), str(f2s.numel()), _ints(f2s),
        str(batch), _ints(rids), _ints(seq_lens), _ints(extend_lens), str(num_rows),
        str(pc.shape[0]), str(num_c), _ints(pc), str(pw.shape[0]), str(num_w), _ints(pw),
    ])
    res = subprocess.run([str(exe)], input=text, capture_output=True, text=True)
    assert res.returncode == 0, f"emulator failed ({op}): {res.stderr}"
    rows: dict[str, list[list[int]]] = {}
    for line in res.stdout.splitlines():
        tag, hexbytes = line.split()
        rows.setdefault(tag, []).append(list(bytes.fromhex(hexbytes)))
    widths = {"D": 16, "C": 16, "W": w_bytes if op.endswith("stage1") else (16 if op.startswith("online") else 8)}
    return {tag: torch.tensor(rows.get(tag, []), dtype=torch.uint8).reshape(-1, widths[tag]) for tag in widths}


def _with_padding(rows: torch.Tensor, total: int) -> torch.Tensor:
    pad = torch.full((total - rows.shape[0], rows.shape[1]), POISON, dtype=torch.uint8)
    return torch.cat([rows, pad])


def _check_prefill_mode(exe, mode, world, rids, seq, ext, num_q, extra_rows) -> None:
    ratio, ring, req_ring = mode
    kw = dict(swa_page_size=256, ring_size=ring, use_req_ring=req_ring, world=world)
    what = mode_id(mode)
    for graph in (False, True):
        want_c, want_w = tp.prefill_plan(ratio, rids, seq, ext, world.req_to_token, world.full_to_state, 256, ring,
                                         num_q, graph, req_ring)
        c0, w0 = tp.prefill_stage0(ratio, seq, ext, 256, ring, req_ring)
        rows_c = num_q if graph else c0.shape[0]
        rows_w = num_q if graph else w0.shape[0]
        out = emulate(exe, "stage1", ratio, rids=rids, seq_lens=seq, plan_c=_with_padding(c0, rows_c),
                      num_c=c0.shape[0], plan_w=_with_padding(w0, rows_w), num_w=w0.shape[0], **kw)
        assert_plan_bytes(out["C"], want_c, f"{what} stage1 plan_c (graph={graph})")
        assert_plan_bytes(out["W"], want_w, f"{what} stage1 plan_w (graph={graph})")
    want_c, want_w = tp.prefill_plan(ratio, rids, seq, ext, world.req_to_token, world.full_to_state, 256, ring,
                                     num_q + extra_rows, True, req_ring)
    out = emulate(exe, "device", ratio, rids=rids, seq_lens=seq, extend_lens=ext, num_rows=num_q + extra_rows, **kw)
    assert_plan_bytes(out["C"], want_c, f"{what} device plan_c")
    assert_plan_bytes(out["W"], want_w, f"{what} device plan_w")


def _check_online(exe, rids, seq, ext, num_q, extra_rows, offset) -> None:
    for graph in (False, True):
        want_c, want_w = tp.online_prefill_plan(seq, ext, rids, num_q, graph, offset)
        c0, w0 = tp.online_prefill_stage0(seq, ext)
        rows_c = num_q if graph else c0.shape[0]
        rows_w = num_q if graph else w0.shape[0]
        out = emulate(exe, "online_stage1", 128, rids=rids, seq_lens=seq, state_slot_offset=offset,
                      plan_c=_with_padding(c0, rows_c), num_c=c0.shape[0], plan_w=_with_padding(w0, rows_w),
                      num_w=w0.shape[0])
        assert_plan_bytes(out["C"], want_c, f"online stage1 plan_c (graph={graph})")
        assert_plan_bytes(out["W"], want_w, f"online stage1 plan_w (graph={graph})")
    want_c, want_w = tp.online_prefill_plan(seq, ext, rids, num_q + extra_rows, True, offset)
    out = emulate(exe, "online_device", 128, rids=rids, seq_lens=seq, extend_lens=ext, num_rows=num_q + extra_rows,
                  state_slot_offset=offset)
    assert_plan_bytes(out["C"], want_c, "online device plan_c")
    assert_plan_bytes(out["W"], want_w, "online device plan_w")


@pytest.mark.parametrize("mode", MODES, ids=mode_id)
def test_emulated_kernels_match_torch(emulator, mode) -> None:
    ratio, ring, req_ring = mode
    world = make_world(seed=5, slots=16, max_ctx=1536)
    rng = random.Random(MODES.index(mode))
    for _ in range(6):
        rids, seq = random_decode_batch(rng, world, rng.randint(1, 20), pad_rows=rng.choice([0, 2]))
        want = tp.decode_plan(ratio, rids, world.req_to_token, world.full_to_state, seq, 256, ring, req_ring)
        out = emulate(emulator, "decode", ratio, rids=rids, seq_lens=seq, ring_size=ring, use_req_ring=req_ring,
                      world=world)
        assert_plan_bytes(out["D"], want, f"{mode_id(mode)} decode", kind="decode")
        rids, seq, ext = random_batch(rng, world, rng.randint(1, 10), rng.choice([3, 20, 300]))
        _check_prefill_mode(emulator, mode, world, rids, seq, ext, int(ext.sum()), rng.choice([0, 1, 17]))


@pytest.mark.parametrize("offset", [0, 9])
def test_emulated_online_kernels_match_torch(emulator, offset) -> None:
    world = make_world(seed=6, slots=16, max_ctx=1536)
    rng = random.Random(offset)
    for _ in range(6):
        rids, seq = random_decode_batch(rng, world, rng.randint(1, 20), pad_rows=1)
        out = emulate(emulator, "online_decode", 128, rids=rids, seq_lens=seq, state_slot_offset=offset)
        assert_plan_bytes(out["D"], tp.online_decode_plan(seq, rids, offset), "online decode", kind="decode")
        rids, seq, ext = random_batch(rng, world, rng.randint(1, 10), rng.choice([3, 20, 300]))
        _check_online(emulator, rids, seq, ext, int(ext.sum()), rng.choice([0, 3]), offset)


def test_emulated_edge_cases(emulator) -> None:
    world = make_world(seed=7, slots=8, max_ctx=32768)
    empty = torch.zeros(0, dtype=torch.int64)
    # B = 0 with padded rows: all sentinels
    out = emulate(emulator, "device", 4, rids=empty, seq_lens=empty, extend_lens=empty, num_rows=5, world=world)
    assert_plan_bytes(out["C"], pad_rows(torch.zeros((0, 16), dtype=torch.uint8), 5, L.INVALID_COMPRESS_ROW), "C")
    assert_plan_bytes(out["W"], pad_rows(torch.zeros((0, 8), dtype=torch.uint8), 5, L.INVALID_WRITE_ROW), "W")
    # 65536 ragged tokens: ragged ids up to 65535
    rids = torch.tensor([1, 3, 5, 7])
    ext = torch.tensor([16768, 16000, 16384, 16384])
    seq = torch.tensor([16768, 16384, 16384, 32768])
    for mode in [(4, 8, False), (4, 16, True), (128, 256, False)]:
        _check_prefill_mode(emulator, mode, world, rids, seq, ext, 65536, 0)
    _check_online(emulator, rids, seq, ext, 65536, 0, 9)
    # 65535 one-token requests: stage-0 batch ids up to 65534
    gen = torch.Generator().manual_seed(7)
    batch = 65535
    rids = torch.randint(1, 8, (batch,), generator=gen)
    seq = torch.randint(1, 4097, (batch,), generator=gen)
    ext = torch.ones(batch, dtype=torch.int64)
    _check_prefill_mode(emulator, (4, 8, False), world, rids, seq, ext, batch, 1)


@pytest.mark.parametrize("relpath", ["plans/plan_c4.pt", "plans/plan_c128.pt", "plans/plan_c128_online.pt"])
def test_emulated_kernels_match_golden(emulator, relpath) -> None:
    """SGLang 0.5.23's bytes: our stage 1 over our stage 0, and our device planner (padded)."""
    d = load_golden(relpath)
    online = "online" in relpath
    calls = sorted({k.split(".")[0] for k in d if "." in k})
    for call in calls:
        g = lambda n: d[f"{call}.{n}"]  # noqa: E731
        rids, seq = g("req_pool_indices"), g("seq_lens")
        if online:
            kw = dict(state_slot_offset=g("state_slot_offset"))
        else:
            kw = dict(swa_page_size=g("swa_page_size"), ring_size=g("ring_size"), use_req_ring=g("use_req_ring"),
                      world=_GoldenWorld(d))
        if g("api").startswith("CompressorDecodePlan"):
            out = emulate(emulator, "online_decode" if online else "decode", 128 if online else g("compress_ratio"),
                          rids=rids, seq_lens=seq, **kw)
            assert_plan_bytes(out["D"], g("plan_d"), f"{call}.plan_d", kind="decode")
            continue
        ext, num_q, graph = g("extend_lens"), g("num_q_tokens"), g("use_cuda_graph")
        if online:
            ratio, (c0, w0), w_sentinel = 128, tp.online_prefill_stage0(seq, ext), L.INVALID_COMPRESS_ROW
        else:
            ratio = g("compress_ratio")
            c0, w0 = tp.prefill_stage0(ratio, seq, ext, g("swa_page_size"), g("ring_size"), g("use_req_ring"))
            w_sentinel = L.INVALID_WRITE_ROW
        rows_c = num_q if graph else c0.shape[0]
        rows_w = num_q if graph else w0.shape[0]
        out = emulate(emulator, "online_stage1" if online else "stage1", ratio, rids=rids, seq_lens=seq,
                      plan_c=_with_padding(c0, rows_c), num_c=c0.shape[0], plan_w=_with_padding(w0, rows_w),
                      num_w=w0.shape[0], **kw)
        assert_plan_bytes(out["C"], g("plan_c"), f"{call}.plan_c (stage 1)")
        assert_plan_bytes(out["W"], g("plan_w"), f"{call}.plan_w (stage 1)")
        out = emulate(emulator, "online_device" if online else "device", ratio, rids=rids, seq_lens=seq,
                      extend_lens=ext, num_rows=num_q + 4, **kw)
        assert_plan_bytes(out["C"], pad_rows(g("plan_c"), num_q + 4, L.INVALID_COMPRESS_ROW), f"{call}.plan_c (dev)")
        assert_plan_bytes(out["W"], pad_rows(g("plan_w"), num_q + 4, w_sentinel), f"{call}.plan_w (dev)")


class _GoldenWorld:
    def __init__(self, d: dict) -> None:
        self.req_to_token = d["req_to_token"]
        self.full_to_state = d["full_to_state"]


@requires_nvcc
def test_ptxas_report_prints_every_kernel_of_a_variant() -> None:
    """``scripts/ptxas_report.py`` builds a variant's kernel TU and reports each kernel's resources."""
    env = dict(os.environ, CUDA_HOME=os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    res = subprocess.run([sys.executable, str(REPO / "scripts" / "ptxas_report.py"), "store:head_dim=128,fmt=idx_fp8,dtype=f32"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stdout.splitlines() if "regs" in line]
    kernels = [line for line in lines if "store_kernel<128, 2, 0, " in line]
    assert len(kernels) == 1, res.stdout
    regs = int(kernels[0].split()[0])
    assert 16 <= regs <= 255 and "spill" in kernels[0]


def test_ptxas_report_counts_sass_per_function(tmp_path: Path) -> None:
    """``ptxas_report.py --sass`` counts each function's SASS instructions (NOPs left out), its
    memory instructions and its hot path from ``nvdisasm -c`` output (a stand-in nvdisasm prints a
    fixed listing)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ptxas_report", REPO / "scripts" / "ptxas_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    listing = """
	.text._Z1av:
        /*0000*/                   LDG.E.128 R4, desc[UR6][R2.64] ;
        /*0010*/               @P0 FADD R1, R2, R3 ;
        /*0020*/              @!P1 BRA `(.L_x_1) ;
        /*0030*/                   NOP ;
        /*0040*/                   STS [R1], R2 ;
	.text._Z1bv:
        /*0000*/                   MUFU.EX2 R1, R2 ;
        /*0010*/                   EXIT ;
"""
    fake = tmp_path / "nvdisasm"
    fake.write_text(f"#!/bin/sh\ncat <<'LISTING'\n{listing}LISTING\n")
    fake.chmod(0o755)
    counts = mod._sass_counts(tmp_path / "unused.cubin", str(fake))
    # (instructions, memory instructions, hot path: the branch to a label outside the listing falls through)
    assert counts == {"_Z1av": (4, 2, 4), "_Z1bv": (2, 0, 2)}
