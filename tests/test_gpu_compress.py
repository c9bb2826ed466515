"""GPU parity of the ``compress`` kernel family (``compress_forward`` and ``compress_and_store``).

Every op an engine simulation issues (``flashcompress.testing.simulator``: both addressing
modes, wrapping and speculative rings, chunked prefill, rolled-back verify steps, CUDA-graph
padding rows, online C128) runs through a *tee* backend: the PyTorch backend runs first on
clones of the state and outputs, then the JIT kernels on the real buffers from the same
inputs, and the two are compared before the simulation goes on:

* state pool: bit-identical (online C128: running max exact, sum within 1e-6 relative, mean
  within 1e-5 of the row's max |mean|; rows the call must not touch bit-identical);
* outputs (poisoned with NaN before the kernel runs): fp32 within 1e-5 of each row's max
  |value| and relative L2 <= 1e-6 per row; bf16 within one bf16 ulp, or 2^-8 of the row's
  max |value|;
* ``compress_and_store``: the fused launch against the two-step GPU path from clones: the
  same cache bytes and a bit-identical state pool.

Plus: the golden vectors of SGLang's kernels, CUDA-graph capture = eager, no host
synchronisation, and the debug-mode bound checks on CUDA tensors.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import flashcompress
from _golden import load_golden
from flashcompress import dispatch
from flashcompress import validation as V
from flashcompress.testing import simulator as S
from flashcompress.torch_backend import ops as torch_ops

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _cuda_ops():
    from flashcompress.cuda_ops import ops

    return ops


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def assert_state_parity(got: torch.Tensor, ref: torch.Tensor, before: torch.Tensor, online: bool,
                        head_dim: int, what: str) -> None:
    diff = (_bits(got) != _bits(ref)).any(dim=1)
    if not online:
        if bool(diff.any()):
            row = int(diff.nonzero()[0])
            col = int((_bits(got[row]) != _bits(ref[row])).nonzero()[0])
            raise AssertionError(f"{what}: state row {row} col {col}: got {got[row, col].item()!r} "
                                 f"expected {ref[row, col].item()!r}")
        return
    touched = (_bits(ref) != _bits(before)).any(dim=1) | (_bits(got) != _bits(before)).any(dim=1)
    if bool((diff & ~touched).any()):
        raise AssertionError(f"{what}: an untouched online state row changed")
    H = head_dim
    rows = diff.nonzero().flatten()
    if rows.numel() == 0:
        return
    g, r = got[rows].double(), ref[rows].double()
    assert torch.equal(_bits(got[rows][:, :H]), _bits(ref[rows][:, :H])), f"{what}: running max differs"
    s_err = ((g[:, H:2 * H] - r[:, H:2 * H]).abs() / r[:, H:2 * H].abs().clamp_min(1e-30)).max()
    assert s_err <= 1e-6, f"{what}: running sum relative error {float(s_err):.3g}"
    k_scale = r[:, 2 * H:].abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    k_err = ((g[:, 2 * H:] - r[:, 2 * H:]).abs() / k_scale).max()
    assert k_err <= 1e-5, f"{what}: running mean error {float(k_err):.3g} of the row max"


def assert_out_parity(got: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert got.shape == ref.shape and got.dtype == ref.dtype, what
    g, r = got.double(), ref.double()
    if not bool(torch.isfinite(g).all()):
        row = int((~torch.isfinite(g)).any(dim=1).nonzero()[0])
        raise AssertionError(f"{what}: row {row} not written (poison left) or not finite")
    zero = (r == 0).all(dim=1)
    assert bool((g[zero] == 0).all()), f"{what}: rows without an event must be zeros"
    scale = r.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    err = (g - r).abs()
    if got.dtype == torch.float32:
        bad = err > 1e-5 * scale
        l2 = (err.pow(2).sum(dim=1).sqrt() / r.pow(2).sum(dim=1).sqrt().clamp_min(1e-30))
        if bool(l2[~zero].gt(1e-6).any()):
            row = int((l2 > 1e-6).nonzero()[0])
            raise AssertionError(f"{what}: row {row} relative L2 error {float(l2[row]):.3g} > 1e-6")
    else:
        ulp = torch.exp2(torch.floor(torch.log2(r.abs().clamp_min(1e-38))) - 7)
        bad = (err > ulp) & (err > scale * 2.0**-8)
    if bool(bad.any()):
        row, col = bad.nonzero()[0].tolist()
        raise AssertionError(f"{what}: row {row} col {col}: got {g[row, col].item()!r} expected "
                             f"{r[row, col].item()!r} (row max {scale[row, 0].item():.4g})")


def _settle_shared_decode_rows(state: torch.Tensor, ref: torch.Tensor, inp: torch.Tensor, plan_rows: torch.Tensor,
                               online: bool, what: str) -> None:
    """State rows that several decode rows write (CUDA-graph padding rows all write position 0 of
    the padding slot) hold whichever write lands last, in either backend, and concurrent writers
    may interleave.  Every element of such a regular row must come from one of its writers'
    input rows; then the row is excluded from the bitwise comparison (an online row is a
    computed state and is just excluded)."""
    loc = plan_rows.view(torch.int32)[:, 1].long()
    uniq, counts = torch.unique(loc, return_counts=True)
    for row in uniq[counts > 1].tolist():
        writers = (loc == row).nonzero().flatten()
        if not online:
            cands = inp[writers].to(state.dtype)
            assert bool((_bits(cands) == _bits(state[row : row + 1])).any(dim=0).all()), (
                f"{what}: state row {row} (written by decode rows {writers.tolist()}) holds values from none of them")
        state_row = state[row].clone()
        ref[row] = state_row


class Tee:
    """A backend module that runs the reference on clones, then the kernels (compress variants of
    the given ``tiling``), and compares."""

    def __init__(self, in_dtype: torch.dtype | None = None, tiling: str = "auto"):
        self.kernel = _cuda_ops()
        self.in_dtype = in_dtype  # cast inputs (both backends see the same cast tensor)
        self.tiling = tiling
        self.calls = {"compress_forward": 0, "compress_norm_rope_store": 0, "compress_and_store": 0}

    def _inputs(self, inp: torch.Tensor, ape: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.in_dtype is None or self.in_dtype == inp.dtype:
            return inp, ape
        return inp.to(self.in_dtype), ape.to(self.in_dtype)

    def compress_forward(self, call, out):
        inp, ape = self._inputs(call.inp, call.ape)
        call = call._replace(inp=inp, ape=ape)
        state, plan_rows, plan_w = call.state, call.plan_rows, call.plan_w
        kout = out if out.dtype == inp.dtype or self.in_dtype is None else torch.empty_like(out, dtype=inp.dtype)
        before = state.clone()
        ref_state, ref_out = state.clone(), torch.full_like(kout, float("nan"))
        torch_ops.compress_forward(call._replace(pool=ref_state), ref_out)
        kout.fill_(float("nan"))
        self.kernel.compress_forward(call, kout, tiling=self.tiling)
        what = f"compress_forward call {self.calls['compress_forward']} ({'decode' if plan_w is None else 'prefill'})"
        online = call.layer.online
        if plan_w is None:
            _settle_shared_decode_rows(state, ref_state, inp, plan_rows, online, what)
        assert_state_parity(state, ref_state, before, online, call.layer.head_dim, what)
        assert_out_parity(kout, ref_out, what)
        if kout is not out:
            out.copy_(kout)
        self.calls["compress_forward"] += 1

    def compress_norm_rope_store(self, call):
        self.kernel.compress_norm_rope_store(call)
        self.calls["compress_norm_rope_store"] += 1

    def compress_and_store(self, call):
        inp, ape = self._inputs(call.inp, call.ape)
        call = call._replace(inp=inp, ape=ape)
        state, plan_rows, st = call.state, call.plan_rows, call.store
        ref_state, ref_cache = state.clone(), st.kvcache.clone()
        # the two-step GPU path on clones
        kv = torch.full((plan_rows.shape[0], call.layer.head_dim), float("nan"), dtype=inp.dtype, device=inp.device)
        self.kernel.compress_forward(call._replace(pool=ref_state, store=None), kv, tiling=self.tiling)
        if plan_rows.shape[0]:
            self.kernel.compress_norm_rope_store(V.StoreCall(kv, plan_rows, call.is_decode, call.layer.ratio,
                                                             st._replace(kvcache=ref_cache), call.device))
        self.kernel.compress_and_store(call, tiling=self.tiling)
        what = f"compress_and_store call {self.calls['compress_and_store']}"
        if call.is_decode:
            _settle_shared_decode_rows(state, ref_state, inp, plan_rows, call.layer.online, what)
        assert torch.equal(_bits(state), _bits(ref_state)), f"{what}: state differs from the two-step path"
        if not torch.equal(st.kvcache, ref_cache):
            diff = (st.kvcache != ref_cache).nonzero()
            page, byte = diff[0].tolist()
            raise AssertionError(f"{what}: {diff.shape[0]} cache bytes differ from the two-step path, first at "
                                 f"page {page} byte {byte}: {int(st.kvcache[page, byte])} vs "
                                 f"{int(ref_cache[page, byte])}")
        self.calls["compress_and_store"] += 1


@pytest.fixture()
def tee(monkeypatch: pytest.MonkeyPatch):
    def make(in_dtype: torch.dtype | None = None, tiling: str = "auto") -> Tee:
        t = Tee(in_dtype, tiling)
        monkeypatch.setattr(dispatch, "ops_backend", lambda device: t)
        return t

    return make


def _scenarios() -> dict[str, S.Scenario]:
    from test_properties import SCENARIOS

    return SCENARIOS


TILINGS = ["auto", "whole_row"]  # the compress family's prefill tilings (cuda_ops/compress.py)
# (tiling, scenario) ("closing" differs from "auto" in decode only: test_gpu_dec128.py)
TILED = [pytest.param(t, n, id=f"{n}-{t}") for t in TILINGS for n in _scenarios()]


@pytest.mark.parametrize("tiling,name", TILED)
@pytest.mark.parametrize("seed", [0, 1])
def test_kernels_match_torch_over_engine_simulation(tee, name: str, seed: int, tiling: str) -> None:
    t = tee(tiling=tiling)
    res = S.simulate(_scenarios()[name], device="cuda", seed=seed)
    assert t.calls["compress_forward"] > 0
    assert res.ok, res.summary()


@pytest.mark.parametrize("tiling,name", TILED)
def test_fused_matches_two_step_over_engine_simulation(tee, name: str, tiling: str) -> None:
    t = tee(tiling=tiling)
    res = S.simulate(dataclasses.replace(_scenarios()[name], fused=True), device="cuda", seed=0)
    assert t.calls["compress_and_store"] > 0
    assert res.ok, res.summary()


@pytest.mark.parametrize("name", ["c4_paged_ring8", "c128_ring128", "c128_bf16_state", "c4_bf16_state_bf16_store"])
def test_bf16_input_kernels_match_torch(tee, name: str) -> None:
    t = tee(torch.bfloat16)
    S.simulate(_scenarios()[name], device="cuda", seed=0)  # the float64 model check does not apply
    assert t.calls["compress_forward"] > 0


COMPRESS_FILES = ["compress/c4_h512.pt", "compress/c4_h128.pt", "compress/c128_h512.pt",
                  "compress/c128_online_h512.pt", "compress/c4_h512_bf16.pt", "compress/c4_h128_bf16state.pt"]


@pytest.mark.parametrize("path", COMPRESS_FILES)
def test_kernels_reproduce_golden(path: str) -> None:
    from flashcompress import CompressorDecodePlan, CompressorPrefillPlan
    from test_golden_plans_compress import assert_rows_close

    d = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in load_golden(path).items()}
    r, H, online = d["compress_ratio"], d["head_dim"], d["is_online"]
    state = d["state_before"].clone()
    flat = state.view(-1, state.shape[-1])
    for k in range(d["num_steps"]):
        s = lambda n: d[f"step{k}.{n}"]  # noqa: E731
        expected = flat.clone()
        expected[s("state_rows_changed")] = s("state_rows_after")
        plan = (CompressorDecodePlan(r, s("plan_d")) if s("kind") == "decode"
                else CompressorPrefillPlan(r, s("plan_c"), s("plan_w")))
        out = torch.full_like(s("out"), float("nan"))
        flashcompress.compress_forward(state, s("kv_score_input"), d["ape"], plan, head_dim=H, compress_ratio=r,
                                       out=out, is_online=online)
        where = f"{path} step{k}"
        if online:
            torch.testing.assert_close(flat.float(), expected.float(), rtol=1e-5, atol=1e-6, msg=where)
        else:
            assert torch.equal(flat, expected), f"{where}: state differs"
        keep = ~s("out_dont_care")
        assert_rows_close(out[keep].cpu(), s("out")[keep].cpu(), 1e-6, where)
        assert bool((out[~keep] == 0).all()), where


# ---------------------------------------------------------------------------
# Decode batches where teams run many requests and close many rows
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("ratio,H,closing,B", [
    (128, 512, "all", 700), (128, 512, "most", 700), (128, 512, "quarter", 2600),
    (4, 512, "quarter", 2600), (4, 512, "all", 1200), (4, 128, "quarter", 5000)])
def test_decode_many_closing_rows(ratio: int, H: int, closing: str, B: int) -> None:
    """Large decode batches: each team (a cluster when a C128 row is stored) runs a long run of
    requests, closing ones among them (decode_kernel; about 30 C128 teams, 528 C4 head-512 teams
    and 2112 C4 head-128 teams on an H200, so these batches give runs of 2-80 requests: C4's copy
    and bias stages are reused from request to request). Against the PyTorch backend on CPU
    copies (out and state), then the fused launch against the two-step GPU path (both formats of
    the head dim: same bytes, same state)."""
    from flashcompress.layouts import select_cache_format
    from flashcompress.testing.oracle import deepseek_v4_freq_cis

    state, r2t, f2s, ring = _decode_world(ratio, B, H, False, seed=3)
    g = torch.Generator(device="cuda").manual_seed(4)
    W = 8 if ratio == 4 else 128
    ape = torch.randn((W, H), generator=g, device="cuda")
    x = torch.randn((B, (4 if ratio == 4 else 2) * H), generator=g, device="cuda")
    k = torch.randint(2, 4096 // ratio - 2, (B,), generator=g, device="cuda")  # positions < 4096
    seq = ratio * k  # every request closes a window ...
    if closing != "all":  # ... or about 3 in 4 do, or 1 in 4
        moved = 0.25 if closing == "most" else 0.75
        seq = seq - (torch.rand((B,), generator=g, device="cuda") < moved).long() * torch.randint(
            1, ratio, (B,), generator=g, device="cuda")
    rids = torch.arange(1, B + 1, device="cuda")
    plan = _decode_plan(ratio, False, rids, seq, r2t, f2s, ring)
    n_close = int((seq % ratio == 0).sum())
    assert n_close >= {"all": B, "most": B // 2, "quarter": B // 8}[closing]
    tag = f"c{ratio}-{H} decode B={B} {closing}"

    # compress_forward: GPU against the PyTorch backend (CPU copies)
    st_gpu, st_cpu = state.clone(), state.cpu()
    out = flashcompress.compress_forward(st_gpu, x, ape, plan, head_dim=H, compress_ratio=ratio)
    plan_cpu = type(plan)(ratio, plan[1].cpu(), is_online=False)
    ref = flashcompress.compress_forward(st_cpu, x.cpu(), ape.cpu(), plan_cpu, head_dim=H, compress_ratio=ratio)
    assert_out_parity(out.cpu(), ref, f"{tag}: out")
    assert_state_parity(st_gpu.cpu(), st_cpu, state.cpu(), False, H, f"{tag}: state")

    # compress_and_store: the fused launch against the two-step GPU path
    freq = deepseek_v4_freq_cis(int(seq.max()) + 1).cuda()
    w = torch.randn((H,), generator=g, device="cuda") * 0.1 + 1.0
    out_loc = torch.randperm(2 * B, generator=g, device="cuda")[:B]
    page = 2 if ratio == 128 else 64
    for alt in (False, True):  # head 512: V4 / bf16 rows; head 128: FP8 / FP4
        fmt = select_cache_format(H, use_fp4=alt, bf16_store=alt)
        shape = (-(-2 * B // page), fmt.page_bytes(page))  # 2B slots
        cache0 = torch.randint(0, 256, shape, generator=g, device="cuda", dtype=torch.uint8)
        kw = dict(norm_weight=w, norm_eps=1e-6, freq_cis=freq, out_loc=out_loc, page_size=page,
                  use_fp4=alt and H == 128, bf16_store=alt and H == 512)
        two_state, two_cache = state.clone(), cache0.clone()
        kv = flashcompress.compress_forward(two_state, x, ape, plan, head_dim=H, compress_ratio=ratio)
        flashcompress.compress_norm_rope_store(kv, plan, kvcache=two_cache, **kw)
        f_state, f_cache = state.clone(), cache0.clone()
        flashcompress.compress_and_store(f_state, x, ape, plan, head_dim=H, compress_ratio=ratio, kvcache=f_cache, **kw)
        what = f"{tag} {fmt.name}"
        assert torch.equal(f_state, two_state), f"{what}: state"
        diff = (f_cache != two_cache).nonzero()
        assert diff.numel() == 0, f"{what}: {diff.shape[0]} cache bytes differ, first at {diff[0].tolist()}"
        assert not torch.equal(f_cache, cache0), f"{what}: nothing stored"


# ---------------------------------------------------------------------------
# CUDA graphs, streams, no host synchronisation
# ---------------------------------------------------------------------------


def _decode_world(ratio: int, batch: int, head: int, online: bool, seed: int = 0):
    """A request-ring world (every ratio / mode supports it) with random state and inputs."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    ring = 1 if online else (8 if ratio == 4 else 128)
    slots = batch + 1
    width = 3 * head if online else (4 if ratio == 4 else 2) * head
    rows = slots * ring if online else -(-slots * ring // ratio) * ratio
    state = torch.randn((rows, width), generator=g, device="cuda")
    if online:
        state[:, head:2 * head] = state[:, head:2 * head].abs() + 0.5  # sums are positive
    r2t = torch.arange(slots * 4096, dtype=torch.int32, device="cuda").view(slots, 4096)
    f2s = torch.arange(slots * 4096 + 1, dtype=torch.int64, device="cuda")
    return state, r2t, f2s, ring


def _decode_plan(ratio, online, rids, seq, r2t, f2s, ring):
    from flashcompress import CompressorDecodePlan

    if online:
        return CompressorDecodePlan.generate_online(seq, rids, r2t, 0)
    return CompressorDecodePlan.generate(ratio, rids, r2t, f2s, seq, 256, ring, ratio == 4)


@pytest.mark.parametrize("ratio,head,online", [(4, 512, False), (4, 128, False), (128, 512, False), (128, 512, True)])
def test_decode_graph_replay_equals_eager(ratio: int, head: int, online: bool) -> None:
    B, pad = 5, 8
    state, r2t, f2s, ring = _decode_world(ratio, pad, head, online)
    width_in = (4 if ratio == 4 else 2) * head
    ape = torch.randn((8 if ratio == 4 else 128, head), device="cuda")
    rids = torch.arange(1, pad + 1, device="cuda")
    steps = []
    for step in range(3):
        seq = torch.ones(pad, dtype=torch.int64, device="cuda")  # padding rows: seq_len 1
        seq[:B] = torch.tensor([ratio * (3 + step), ratio * 5 - 1 + step, 1000 + step, 7 + step, 128 * 2], device="cuda")
        steps.append((seq, torch.randn((pad, width_in), device="cuda")))
    # eager
    eager_state = state.clone()
    eager_out = []
    for seq, x in steps:
        plan = _decode_plan(ratio, online, rids, seq, r2t, f2s, ring)
        eager_out.append(flashcompress.compress_forward(eager_state, x, ape, plan, head_dim=head,
                                                        compress_ratio=ratio, is_online=online).clone())
    # graph: a static plan refreshed with copy_, static input and output buffers
    g_state = state.clone()
    static_x = torch.zeros((pad, width_in), device="cuda")
    static_plan = _decode_plan(ratio, online, rids, steps[0][0], r2t, f2s, ring)
    static_out = torch.empty((pad, head), device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside capture (module load)
        flashcompress.compress_forward(state.clone(), static_x, ape, static_plan, head_dim=head,
                                       compress_ratio=ratio, out=static_out, is_online=online)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashcompress.compress_forward(g_state, static_x, ape, static_plan, head_dim=head, compress_ratio=ratio,
                                       out=static_out, is_online=online)
    g_state.copy_(state)
    for (seq, x), want in zip(steps, eager_out):
        static_plan.copy_(_decode_plan(ratio, online, rids, seq, r2t, f2s, ring))
        static_x.copy_(x)
        graph.replay()
        assert torch.equal(static_out, want)
    torch.cuda.synchronize()
    assert torch.equal(g_state, eager_state)


@pytest.mark.parametrize("ratio,head", [(4, 512), (4, 128), (128, 512)])
def test_prefill_graph_mode_plans_capture(ratio: int, head: int) -> None:
    from flashcompress import CompressorPrefillPlan

    state, r2t, f2s, ring = _decode_world(ratio, 4, head, False)
    width_in = (4 if ratio == 4 else 2) * head
    ape = torch.randn((8 if ratio == 4 else 128, head), device="cuda")
    rids = torch.tensor([1, 2, 3], device="cuda")
    seq = torch.tensor([300, 133, 260], device="cuda")
    ext = torch.tensor([100, 133, 9], device="cuda")
    num_q = 256  # padded bucket
    x = torch.randn((num_q, width_in), device="cuda")
    plan = CompressorPrefillPlan.generate(ratio, rids, seq, ext, r2t, f2s, 256, ring, num_q, True, ratio == 4)
    eager_state = state.clone()
    want = flashcompress.compress_forward(eager_state, x, ape, plan, head_dim=head, compress_ratio=ratio)
    g_state = state.clone()
    out = torch.empty_like(want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan_g = CompressorPrefillPlan.generate(ratio, rids, seq, ext, r2t, f2s, 256, ring, num_q, True, ratio == 4)
        flashcompress.compress_forward(g_state, x, ape, plan_g, head_dim=head, compress_ratio=ratio, out=out)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
    assert torch.equal(g_state, eager_state)


def test_no_host_synchronisation() -> None:
    from flashcompress import CompressorPrefillPlan

    ratio, head = 4, 512
    state, r2t, f2s, ring = _decode_world(ratio, 4, head, False)
    ape = torch.randn((8, head), device="cuda")
    rids = torch.tensor([1, 2], device="cuda")
    seq = torch.tensor([64, 9], device="cuda")
    dplan = _decode_plan(ratio, False, rids, seq, r2t, f2s, ring)
    pplan = CompressorPrefillPlan.generate(ratio, rids, seq, torch.tensor([30, 9], device="cuda"), r2t, f2s, 256,
                                           ring, 64, True, True)
    x2, x64 = torch.randn((2, 4 * head), device="cuda"), torch.randn((64, 4 * head), device="cuda")
    out2 = torch.empty((2, head), device="cuda")
    out64 = torch.empty((pplan[1].shape[0], head), device="cuda")
    flashcompress.compress_forward(state, x2, ape, dplan, head_dim=head, compress_ratio=ratio, out=out2)  # load
    flashcompress.compress_forward(state, x64, ape, pplan, head_dim=head, compress_ratio=ratio, out=out64)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            flashcompress.compress_forward(state, x2, ape, dplan, head_dim=head, compress_ratio=ratio, out=out2)
            flashcompress.compress_forward(state, x64, ape, pplan, head_dim=head, compress_ratio=ratio, out=out64)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_runs_on_the_callers_stream() -> None:
    ratio, head = 128, 512
    state, r2t, f2s, ring = _decode_world(ratio, 2, head, False)
    ape = torch.randn((128, head), device="cuda")
    rids = torch.tensor([1, 2], device="cuda")
    seq = torch.tensor([256, 384], device="cuda")
    plan = _decode_plan(ratio, False, rids, seq, r2t, f2s, ring)
    x = torch.randn((2, 2 * head), device="cuda")
    ref_state = state.clone()
    want = flashcompress.compress_forward(ref_state, x, ape, plan, head_dim=head, compress_ratio=ratio)
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(20_000_000)  # keep the side stream busy: a launch on another stream would race ahead
        got = flashcompress.compress_forward(state, x, ape, plan, head_dim=head, compress_ratio=ratio)
    s.synchronize()
    assert torch.equal(got, want) and torch.equal(state, ref_state)


# ---------------------------------------------------------------------------
# Debug-mode bounds on CUDA tensors
# ---------------------------------------------------------------------------


def _with_word(plan_bytes: torch.Tensor, row: int, word: int, value: int) -> torch.Tensor:
    p = plan_bytes.clone()
    p.view(torch.int32)[row, word] = value
    return p


@pytest.mark.parametrize("field,word,value", [("write_loc", 1, 10**6), ("read_page_0", 2, -3), ("read_page_1", 3, 10**5)])
def test_debug_mode_rejects_out_of_range_decode_plans(debug_mode, field: str, word: int, value: int) -> None:
    from flashcompress import CompressorDecodePlan

    ratio, head = 4, 512
    state, r2t, f2s, ring = _decode_world(ratio, 2, head, False)
    ape = torch.randn((8, head), device="cuda")
    rids = torch.tensor([1, 2], device="cuda")
    good = _decode_plan(ratio, False, rids, torch.tensor([8, 12], device="cuda"), r2t, f2s, ring)
    bad = CompressorDecodePlan(ratio, _with_word(good[1], 0, word, value))
    x = torch.randn((2, 4 * head), device="cuda")
    before = state.clone()
    out = torch.full((2, head), 7.0, device="cuda")
    with pytest.raises(ValueError, match="plan"):
        flashcompress.compress_forward(state, x, ape, bad, head_dim=head, compress_ratio=ratio, out=out)
    assert torch.equal(state, before) and bool((out == 7).all())
    flashcompress.compress_forward(state, x, ape, good, head_dim=head, compress_ratio=ratio, out=out)
    torch.cuda.synchronize()  # no illegal address left behind


@pytest.mark.parametrize("field", ["ragged_id", "read_page_1", "write_loc", "write_ragged_id"])
def test_debug_mode_rejects_out_of_range_prefill_plans(debug_mode, field: str) -> None:
    from flashcompress import CompressorPrefillPlan

    ratio, head = 128, 512
    state, r2t, f2s, ring = _decode_world(ratio, 2, head, False)
    ape = torch.randn((128, head), device="cuda")
    rids = torch.tensor([1], device="cuda")
    seq, ext = torch.tensor([300]), torch.tensor([100])
    good = CompressorPrefillPlan.generate(ratio, rids, seq, ext, r2t, f2s, 256, ring, 100, False, False)
    plan_c, plan_w = good[1].clone(), good[2].clone()
    if field == "ragged_id":  # u16 at bytes 4-5: past the input
        plan_c.view(torch.int16)[0, 2] = 3000
    elif field == "read_page_1":
        plan_c.view(torch.int32)[0, 3] = 10**5
    elif field == "write_loc":
        plan_w.view(torch.int32)[0, 1] = 10**6
    else:
        plan_w.view(torch.int32)[0, 0] = 5000
    bad = CompressorPrefillPlan(ratio, plan_c, plan_w)
    x = torch.randn((100, 2 * head), device="cuda")
    before = state.clone()
    with pytest.raises(ValueError, match="plan"):
        flashcompress.compress_forward(state, x, ape, bad, head_dim=head, compress_ratio=ratio)
    assert torch.equal(state, before)
    flashcompress.compress_forward(state, x, ape, good, head_dim=head, compress_ratio=ratio)
    torch.cuda.synchronize()


def test_empty_batches_are_no_ops() -> None:
    from flashcompress import CompressorDecodePlan

    state = torch.randn((16, 2048), device="cuda")
    before = state.clone()
    plan = CompressorDecodePlan(4, torch.empty((0, 16), dtype=torch.uint8, device="cuda"))
    out = flashcompress.compress_forward(state, torch.empty((0, 2048), device="cuda"),
                                         torch.randn((8, 512), device="cuda"), plan, head_dim=512,
                                         compress_ratio=4)
    assert out.shape == (0, 512) and torch.equal(state, before)
    assert math.isfinite(float(state.sum()))


# ---------------------------------------------------------------------------
# Bad input on CUDA tensors: the short path's checks live in the kernel binding
# ---------------------------------------------------------------------------


def _bad_cases():
    H = 512

    def decode_args():
        state, r2t, f2s, ring = _decode_world(4, 2, H, False)
        rids = torch.tensor([1, 2], device="cuda")
        plan = _decode_plan(4, False, rids, torch.tensor([8, 13], device="cuda"), r2t, f2s, ring)
        return dict(kv_score_buffer=state, kv_score_input=torch.randn((2, 4 * H), device="cuda"),
                    ape=torch.randn((8, H), device="cuda"), plan=plan, head_dim=H, compress_ratio=4)

    def with_(**changes):
        def make():
            args = decode_args()
            for k, v in changes.items():
                args[k] = v(args) if callable(v) else v
            return args
        return make

    return {
        "input_dtype": (TypeError, "kv_score_input", with_(kv_score_input=lambda a: a["kv_score_input"].half())),
        "input_width": (ValueError, "kv_score_input", with_(kv_score_input=lambda a: a["kv_score_input"][:, :1024])),
        "input_rows": (ValueError, "kv_score_input", with_(kv_score_input=lambda a: a["kv_score_input"][:1])),
        "input_device": (ValueError, "kv_score_input", with_(kv_score_input=lambda a: a["kv_score_input"].cpu())),
        "ape_shape": (ValueError, "ape", with_(ape=lambda a: a["ape"][:4])),
        "out_shape": (ValueError, "out", with_(out=lambda a: torch.empty((3, H), device="cuda"))),
        "out_dtype": (TypeError, "out", with_(out=lambda a: torch.empty((2, H), device="cuda", dtype=torch.float16))),
        "state_width": (ValueError, "kv_score_buffer", with_(kv_score_buffer=lambda a: a["kv_score_buffer"][:, :1024])),
        # views at a 4-byte offset: rows are read by 16-byte vectors
        "input_misaligned": (ValueError, "kv_score_input", with_(kv_score_input=lambda a: _misaligned(a["kv_score_input"]))),
        "ape_misaligned": (ValueError, "ape", with_(ape=lambda a: _misaligned(a["ape"]))),
        "state_misaligned": (ValueError, "kv_score_buffer", with_(kv_score_buffer=lambda a: _misaligned(a["kv_score_buffer"]))),
        # rows are written by 4-element vectors
        "out_misaligned": (ValueError, "out", with_(out=lambda a: _misaligned(torch.zeros((2, H), device="cuda")))),
    }


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of t whose data starts 4 bytes past a 16-byte boundary."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = flat[1:].view(t.shape)
    view.copy_(t)
    assert view.data_ptr() % 16 == 4
    return view


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_cuda_bad_input_is_named_and_writes_nothing(case: str) -> None:
    exc, arg, make = _bad_cases()[case]
    args = make()
    state = args["kv_score_buffer"]
    before = state.clone()
    out = args.get("out")
    out_before = None if out is None else out.clone()
    with pytest.raises(exc, match=arg):
        flashcompress.compress_forward(**args)
    torch.cuda.synchronize()
    assert torch.equal(state, before), "the state pool was written"
    if out is not None:
        assert torch.equal(out.nan_to_num(), out_before.nan_to_num())
