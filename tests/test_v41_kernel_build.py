"""The ``v41`` JIT family without a GPU (``pytest -m nvcc``): registration, an sm_90a build, the fp4 encoder.

* The family registers its space (op x layout x design, index_k only with layout ``none`` and
  design ``base``) and exports.
* c1, c2_prefill (the c2 pool kernel + write-back) and index_k render, compile for sm_90a through
  the JIT engine and load, in both designs (``base``, ``fast``).
* The c2 pair weight (libdevice's exp path, replayed on the host) against glibc's exp.
* Every v41 kernel (base and fast designs) waits on griddepcontrol before its first global access
  and before triggering its dependents (PTX order).
* ``benchmarks/bench_v41.py --device cpu`` runs (smoke).
* ``v41q::e2m1_rne`` (jit_kernel/v41_quant.cuh, the fp32 -> e2m1 encoder the kernels use on
  sm_90) gives the PyTorch backend's RNE codes on the e2m1 ties, around every midpoint, and on
  a spread of random fp32 patterns (NaN excluded: both map it to 0x7 anyway).
* The fast design's division-free quantisation (``v41q::recip_e4m3`` / ``div_by`` /
  ``fake_quant_grid`` / ``fp4_code``): exhaustively equal to the IEEE quotient's e2m1 code and
  fake-quant value over every bf16 numerator and e4m3 scale (``tests/native/v41_div_host.cpp``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from _jit_helpers import REPO, apply_environ, clean_environ, requires_nvcc, reset_engine
from flashcompress.torch_backend.v41_quant import e2m1_rne_codes


@pytest.fixture()
def jit_env(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cache = tmp_path_factory.getbasetemp() / "jit-cache-shared"
    cache.mkdir(exist_ok=True)
    apply_environ(monkeypatch, clean_environ(cache, tmp_path / "xdg"))
    yield
    reset_engine()


def test_v41_family_registration() -> None:
    from flashcompress.cuda_ops import v41
    from flashcompress.jit import get_family

    fam = get_family("v41")
    assert fam is v41.V41 and fam.exports == ("forward",)
    variants = fam.expand()
    assert len(variants) == 3 * 6 * 4 + 1  # (c1, c2_decode, c2_prefill) x layouts x designs + index_k
    assert {"op": "index_k", "layout": "none", "design": "base"} in variants
    assert fam.key(target="cuda:9.0a", op="c1", layout="v4").param_dict["design"] == "fast3"
    with pytest.raises(ValueError):
        fam.key(target="cuda:9.0a", op="c1", layout="none")
    with pytest.raises(ValueError):
        fam.key(target="cuda:9.0a", op="index_k", layout="v4")
    with pytest.raises(ValueError):
        fam.key(target="cuda:9.0a", op="index_k", layout="none", design="fast")


def test_v41_design_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    from flashcompress.cuda_ops import v41

    monkeypatch.setattr(v41, "_DESIGN", [v41.current_design()])
    v41.set_design("fast")
    assert v41.current_design() == "fast"
    with pytest.raises(ValueError):
        v41.set_design("quick")


@pytest.mark.nvcc
@requires_nvcc
@pytest.mark.parametrize("op,layout,design", [("c1", "v4", "base"), ("c2_prefill", "v41_fp4_new", "base"),
                                              ("index_k", "none", "base"), ("c1", "v41_fp4", "fast"),
                                              ("c2_prefill", "v4", "fast"), ("c1", "v4", "fast2"),
                                              ("c2_prefill", "v41_fp4", "fast3")])
def test_v41_variant_builds_for_sm90a(jit_env, op: str, layout: str, design: str) -> None:
    from flashcompress.jit import get_module

    module = get_module("v41", target="cuda:9.0a", op=op, layout=layout, design=design)
    assert module.implements_function("forward")


def _probe_values() -> torch.Tensor:
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, 7.0, 1e30])
    bits = mids.view(torch.int32)
    near = torch.cat([bits + k for k in (-2, -1, 0, 1, 2)]).view(torch.float32)
    rand = torch.randint(-2**31, 2**31 - 1, (20000,), generator=torch.Generator().manual_seed(0), dtype=torch.int64)
    rand = rand.to(torch.int32).view(torch.float32)
    small = torch.randn(20000, generator=torch.Generator().manual_seed(1)) * 3
    x = torch.cat((near, -near, rand, small, torch.tensor([float("inf"), -float("inf"), -0.0])))
    return x[~torch.isnan(x)]


def _host_check(tmp_path: Path, name: str, *args: str, opt: str = "-O2", stdin: str | None = None) -> str:
    """Compile ``tests/native/<name>.cpp`` on the host (``-ffp-contract=off``: every fma as written,
    ``jit_kernel/`` on the include path), run it and return its stdout; a non-zero exit fails."""
    cxx = shutil.which(os.environ.get("CXX") or "c++")
    exe = tmp_path / name
    subprocess.run([cxx, "-std=c++17", opt, "-ffp-contract=off", f"-I{REPO / 'jit_kernel'}",
                    str(REPO / f"tests/native/{name}.cpp"), "-o", str(exe)], check=True, capture_output=True, text=True)
    res = subprocess.run([str(exe), *args], input=stdin, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


@pytest.mark.nvcc
@requires_nvcc
def test_e2m1_encoder_matches_reference(tmp_path: Path) -> None:
    x = _probe_values()
    stdin = "\n".join(str(int(b) & 0xFFFFFFFF) for b in x.view(torch.int32).tolist())
    out = _host_check(tmp_path, "v41_quant_host", opt="-O1", stdin=stdin).split()
    got = torch.tensor([int(v) for v in out], dtype=torch.uint8)
    want = e2m1_rne_codes(x)
    bad = got != want
    assert not bool(bad.any()), f"{int(bad.sum())} codes differ, e.g. x={x[bad][:4].tolist()}"


@pytest.mark.nvcc
@requires_nvcc
def test_fast_division_free_quantisation_is_exact(tmp_path: Path) -> None:
    out = _host_check(tmp_path, "v41_div_host")
    assert "fake_quant_grid_bad 0 fp4_code_bad 0" in out and "code_bad 0" in out, out


@pytest.mark.nvcc
@requires_nvcc
def test_fast3_primitives_are_exact(tmp_path: Path) -> None:
    """Design fast3's scalar primitives equal the other designs' (tests/native/v41_fast3_host.cpp):
    the e4m3 scale value (bit placement + one multiply) on every non-negative e4m3 code, the scale
    reciprocal (one Newton step from any estimate within 16 ulps) on every e4m3 scale, the fake-quant
    grid with its copied sign on every bf16 input and scale, and the pair weight's clamp at
    |d| = 104 (+0: fp32(exp(-104)), libdevice's path and glibc)."""
    out = _host_check(tmp_path, "v41_fast3_host")
    assert "value_bad 0 clamp_ok 1" in out and "recip_bad 0" in out and " grid_bad 0" in out, out


@pytest.mark.nvcc
@requires_nvcc
def test_fast3_uses_the_hardware_scale_conversion(tmp_path: Path) -> None:
    """fast3's wide c1 kernel encodes its fp4 scale bytes with cvt.rn.satfinite.e4m3x2 (two more
    conversions per row than fast2's, whose scale bytes take the software encoder) and rounds the
    latent two values per cvt.rn.bf16x2 (no scalar cvt.rn.bf16.f32 left in the kernel); its c2
    prefill pool pass takes the pair weight's NaN through max.NaN (fast2's: selects), reads its exp
    constants from the constant bank; both designs compile the pool pass for 4 blocks per SM."""
    from _jit_helpers import variant_ptx

    def entry(op: str, design: str, name: str) -> str:
        tmp = tmp_path / f"{op}-{design}"
        tmp.mkdir()
        ptx = variant_ptx("v41", {"op": op, "layout": "v41_fp4", "design": design}, tmp)
        starts = [m.start() for m in re.finditer(r"^\.visible \.entry ", ptx, re.M)] + [len(ptx)]
        bodies = [ptx[b:e] for b, e in zip(starts, starts[1:]) if name in ptx[b:ptx.find("(", b)]]
        assert bodies, name
        return bodies[0]

    fast2, fast3 = entry("c1", "fast2", "c1_fast_kernel"), entry("c1", "fast3", "c1_fast_kernel")
    assert fast3.count("cvt.rn.satfinite.e4m3x2.f32") == fast2.count("cvt.rn.satfinite.e4m3x2.f32") + 2
    assert "cvt.rn.bf16.f32" not in fast3 and "cvt.rn.bf16.f32" in fast2
    pool2, pool3 = entry("c2_prefill", "fast2", "c2_prefill_fast_kernel"), entry("c2_prefill", "fast3", "c2_prefill_fast_kernel")
    assert pool3.count("max.NaN.f32") == 16 and "max.NaN.f32" not in pool2
    # the pool pass's register cap: 4 blocks of 128 threads per SM (5 measured slower: RESULTS.md)
    assert ".minnctapersm 4" in pool3 and ".minnctapersm 4" in pool2
    # fast3's exp constants come from the constant bank (fp64 FMA operands), fast2's are immediates
    assert "ld.const.f64" in pool3 and "ld.const.f64" not in pool2


def test_ptxas_report_hot_path_skips_slow_blocks() -> None:
    """``ptxas_report.hot_path`` (the ``hot`` column of ``--sass``): a predicated branch over a short
    block with a CALL (a slow path) is taken, one over ordinary code is not, BRA.DIV and a
    predicated EXIT are not taken, an unconditional branch is followed to the final EXIT."""
    from _jit_helpers import ptxas_report

    def ins(op: str, pred: bool = False, rest: str = "") -> tuple[str, str, bool, str]:
        return ("I", op, pred, rest)

    items = [ins("S2R"), ins("BRA", True, " `(.L_x_0)"), ins("MOV"), ins("CALL.REL.NOINC"), ("L", ".L_x_0", False, ""),
             ins("BRA.DIV", False, " UR4, `(.L_x_2)"), ins("EXIT", True), ins("BRA", True, " `(.L_x_1)"), ins("FADD"),
             ("L", ".L_x_1", False, ""), ins("BRA", False, " `(.L_x_3)"), ("L", ".L_x_2", False, ""), ins("SHFL.IDX"),
             ("L", ".L_x_3", False, ""), ins("EXIT")]
    # S2R, BRA (taken over the slow block), BRA.DIV, @P EXIT, BRA (not taken), FADD, BRA, EXIT
    assert ptxas_report().hot_path(items) == 8


@pytest.mark.nvcc
@requires_nvcc
def test_pair_weight_exp_matches_glibc(tmp_path: Path) -> None:
    """The pair weight fp32(exp(-|d|)) as both kernel designs compute it (libdevice's exp fast path,
    replayed on the host) equals fp32(glibc exp) on a stride-97 sweep of every fp32 |d| < 104 (the
    full sweep, stride 1, found no difference either: tests/native/v41_exp_host.cpp without args)."""
    out = _host_check(tmp_path, "v41_exp_host", "97")
    assert " differ 0" in out, out


_GLOBAL_ACCESS = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:ld\.global|ld\.volatile\.global|st\.global|atom\.global|red\.global"
                            r"|prefetch\.global|cp\.async(?!\.(?:commit|wait)))", re.M)
_GLOBAL_STORE = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:st\.global|atom\.global|red\.global)", re.M)


@pytest.mark.nvcc
@requires_nvcc
@pytest.mark.parametrize("op,layout,design", [("c1", "v4", "fast"), ("c2_decode", "v41_fp4", "fast"),
                                              ("c2_prefill", "v4", "fast"), ("c1", "v41", "fast2"),
                                              ("c2_decode", "v4", "fast2"), ("c2_decode", "v4", "base"),
                                              ("c1", "v4", "fast3"), ("c1", "v41_fp4", "fast3"),
                                              ("c2_decode", "v41", "fast3"), ("c2_prefill", "v4", "fast3"),
                                              ("c2_prefill", "uniform_fp8", "fast3")])
def test_v41_kernels_wait_before_any_global_access(tmp_path: Path, op: str, layout: str, design: str) -> None:
    """Every v41 kernel is a programmatic dependent: griddepcontrol.wait precedes its first
    global-memory access (the pinned ld.volatile loads of the fast designs included) and its
    launch_dependents (PTX order = program order: everything is inlined). The c2 prefill
    write-back is the one exception, by design: it reads only what the pool pass never writes, so
    its loads may precede the wait, but its first global store must follow it (the pool pass reads
    the ring rows that it overwrites)."""
    from _jit_helpers import variant_ptx

    ptx = variant_ptx("v41", {"op": op, "layout": layout, "design": design}, tmp_path)
    starts = [m.start() for m in re.finditer(r"^\.visible \.entry ", ptx, re.M)] + [len(ptx)]
    assert len(starts) >= 2
    for begin, end in zip(starts, starts[1:]):
        body = ptx[begin:end]
        wait = body.find("griddepcontrol.wait")
        writeback = "c2_writeback_kernel" in body[:body.find("(")]
        first = (_GLOBAL_STORE if writeback else _GLOBAL_ACCESS).search(body)
        assert wait >= 0 and first is not None and first.start() > wait, body[:200]
        trigger = body.find("griddepcontrol.launch_dependents")
        assert trigger < 0 or trigger > wait, body[:200]


def test_bench_v41_cpu_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    """``benchmarks/bench_v41.py --device cpu`` prints one row per op (the PyTorch backend, tiny sizes)."""
    import runpy
    import sys

    bench = str(REPO / "benchmarks")
    argv, path = sys.argv, sys.path[:]
    sys.path.insert(0, bench)
    sys.argv = [f"{bench}/bench_v41.py", "--device", "cpu", "--reps", "1"]
    try:
        with pytest.raises(SystemExit) as exit_info:
            runpy.run_path(f"{bench}/bench_v41.py", run_name="__main__")
    finally:
        sys.argv, sys.path[:] = argv, path
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for case in ("c1-decode-8", "c2-decode-8", "c2-prefill-2x16", "index-k-8"):
        assert any(line.startswith(case + " ") for line in out.splitlines()), out
