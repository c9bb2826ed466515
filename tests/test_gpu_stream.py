"""GPU checks of the compress family's ``tiling="stream"`` (jit_kernel/compress_stream.cuh).

The streaming C128 prefill compress pass must give exactly the bytes of the default tiling
(``auto``: the same entries, channels and merge order per thread), and through it everything the
default tiling gives: parity with the PyTorch backend, the fused path's cache bytes, CUDA-graph
capture. Compared here, for tiling "stream" against "auto":

* direct prefill calls (several requests, chunked prefill with a state prefix, requests shorter
  than a window, a 32768-token request whose 256 rows wrap every block's ring several times,
  invalid rows between pooled ones): ``compress_forward`` output and state pool bit-identical,
  in every input / state dtype pair, and within the GPU tests' tolerances of the PyTorch backend
  (host-built plans: the stream pass takes only dense plans; a padded CUDA-graph planner plan
  keeps the default pass, checked too);
* ``compress_and_store`` (stream: the streaming pass, then the store kernel) against the default
  two-step path: the same cache bytes and state (regular fp32 / bf16 input, online);
* the same for online C128 (output bit-identical to auto; state and output within the GPU
  tests' online tolerances of the PyTorch backend);
* the engine simulations of the C128 and online C128 scenarios through a tee backend (PyTorch reference, then
  the stream kernels, each prefill call also run with the default tiling on clones and
  compared bit for bit; fp32 and bf16 input);
* a CUDA graph replaying the stream pass = eager default tiling (C128 and online);
* decode calls with tiling "stream" = the default tiling (the same decode kernels).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

import pytest
import torch

import flashcompress
from flashcompress import dispatch
from flashcompress.testing import simulator as S
from flashcompress.torch_backend import ops as torch_ops

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

H = 512
F32, BF16 = torch.float32, torch.bfloat16


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def _assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, what
    diff = _bits(got) != _bits(want)
    if bool(diff.any()):
        idx = diff.nonzero()[0].tolist()
        raise AssertionError(f"{what}: {int(diff.sum())} elements differ, first at {idx}: "
                             f"{got[tuple(idx)].item()!r} vs {want[tuple(idx)].item()!r}")


@contextlib.contextmanager
def tiling(name: str) -> Iterator[None]:
    """Calls through the public API (fast path included) run the compress variants of tiling ``name``."""
    from flashcompress.cuda_ops import compress as cc

    saved = cc.current_tiling()
    cc.set_tiling(name)
    try:
        yield
    finally:
        cc.set_tiling(saved)


@contextlib.contextmanager
def torch_backend() -> Iterator[None]:
    """Calls through the public API run the PyTorch backend (on the CUDA tensors)."""
    saved = dispatch.ops_backend
    dispatch.ops_backend = lambda device: torch_ops
    try:
        yield
    finally:
        dispatch.ops_backend = saved


@pytest.fixture(scope="module", autouse=True)
def _no_hang() -> None:
    """One small stream call first, watched: a pipeline that never completes (an mbarrier phase
    never reached) would hold the GPU until the run's time limit, so end the process instead."""
    import os
    import sys
    import time

    seqs, exts = CASES["mixed"]
    state, x, ape, plan, _ = _world(seqs, exts, F32, F32)
    with tiling("stream"):
        _forward(state, x, ape, plan)
    done = torch.cuda.Event()
    done.record()
    deadline = time.monotonic() + 180.0  # the kernels only (the module is built); room for compute-sanitizer
    while not done.query():
        if time.monotonic() > deadline:
            print("test_gpu_stream: the stream prefill kernel did not finish within 180 s (hang); "
                  "ending the process", file=sys.stderr, flush=True)
            os._exit(70)
        time.sleep(0.01)


# ---------------------------------------------------------------------------
# Direct prefill calls
# ---------------------------------------------------------------------------

# (seq_lens, extend_lens) per case: the chunk of request i is positions [seq - ext, seq).
CASES = {
    # prefix 200 (window 2: 72 state entries), whole short request (one window), 9 new tokens
    # closing a window (123 state entries), a 1000-token request, one new token closing the
    # first window (127 state entries), a request shorter than a window (no row)
    "mixed": ([300, 133, 260, 1000, 128, 5], [100, 133, 9, 1000, 1, 5]),
    "long_32768": ([32768], [32768]),
    "long_chunked": ([8192 + 77, 4000, 700], [8192, 3987, 700]),
    "no_window": ([100, 7], [100, 7]),
}


def _with_holes(plan, every: int):
    """``plan`` with an invalid CompressPlan row after every ``every`` rows (0: unchanged): rows
    the pass must leave zero, between rows it pools (padding the graph planner only appends)."""
    from flashcompress import CompressorPrefillPlan
    from flashcompress.layouts import INVALID_COMPRESS_ROW

    if every == 0 or plan[1].shape[0] == 0:
        return plan
    rows = plan[1]
    hole = torch.tensor(list(INVALID_COMPRESS_ROW), dtype=torch.uint8, device=rows.device).view(1, 16)
    parts = []
    for i in range(0, rows.shape[0], every):
        parts += [rows[i:i + every], hole]
    return CompressorPrefillPlan(plan[0], torch.cat(parts).contiguous(), plan[2], is_online=plan.is_online)


def _world(seqs: list[int], exts: list[int], in_dtype: torch.dtype, state_dtype: torch.dtype,
           holes: int = 0, seed: int = 0):
    """A C128 world (always the request ring: state row rid * 128 + p % 128): slots 1..B, random
    state, input and ape, and the prefill plan from host lengths (exact rows; the stream pass
    takes only such dense plans, compress_stream.cuh stream_prefill_fits), with an invalid row
    after every ``holes`` rows when > 0."""
    from flashcompress import CompressorPrefillPlan

    g = torch.Generator(device="cuda").manual_seed(seed)
    B = len(seqs)
    slots, ring, max_ctx = B + 1, 128, 32768 + 256
    state = torch.randn((slots * ring, 2 * H), generator=g, device="cuda").to(state_dtype)
    r2t = torch.arange(slots * max_ctx, dtype=torch.int32, device="cuda").view(slots, max_ctx)
    f2s = torch.arange(slots * max_ctx + 1, dtype=torch.int64, device="cuda")
    rids = torch.arange(1, B + 1, device="cuda")
    seq = torch.tensor(seqs)
    ext = torch.tensor(exts)
    num_q = sum(exts)
    x = torch.randn((num_q, 2 * H), generator=g, device="cuda").to(in_dtype)
    ape = (0.5 * torch.randn((128, H), generator=g, device="cuda")).to(in_dtype)
    plan = _with_holes(CompressorPrefillPlan.generate(128, rids, seq, ext, r2t, f2s, 256, ring, num_q), holes)
    return state, x, ape, plan, (rids, seq, ext, r2t, f2s, ring, num_q)


def _forward(state: torch.Tensor, x: torch.Tensor, ape: torch.Tensor, plan) -> torch.Tensor:
    return flashcompress.compress_forward(state, x, ape, plan, head_dim=H, compress_ratio=128)


def _assert_close_to_reference(got: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    from test_gpu_compress import assert_out_parity

    assert_out_parity(got, ref, what)


DTYPES = [(F32, F32), (BF16, BF16), (BF16, F32), (F32, BF16)]


@pytest.mark.parametrize("in_dtype,state_dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("holes", [0, 3])
def test_stream_prefill_equals_default_tiling(case: str, in_dtype: torch.dtype, state_dtype: torch.dtype,
                                              holes: int) -> None:
    seqs, exts = CASES[case]
    state, x, ape, plan, _ = _world(seqs, exts, in_dtype, state_dtype, holes)
    st_auto, st_stream, st_ref = state.clone(), state.clone(), state.clone()
    with tiling("auto"):
        out_auto = _forward(st_auto, x, ape, plan)
    with tiling("stream"):
        out_stream = _forward(st_stream, x, ape, plan)
    with torch_backend():
        out_ref = _forward(st_ref, x, ape, plan)
    torch.cuda.synchronize()
    what = f"{case} {in_dtype}/{state_dtype} holes {holes}"
    _assert_same_bits(out_stream, out_auto, f"{what}: stream output vs auto")
    _assert_same_bits(st_stream, st_auto, f"{what}: stream state vs auto")
    _assert_same_bits(st_stream, st_ref, f"{what}: stream state vs torch")
    _assert_close_to_reference(out_stream, out_ref, f"{what}: stream output vs torch")


def _online_world(seqs: list[int], exts: list[int], holes: int = 0, seed: int = 0):
    """An online C128 world: slot rid's state row rid = [max M | sum S | mean K] (sums positive);
    the plan from host lengths, with an invalid row after every ``holes`` rows when > 0."""
    from flashcompress import CompressorPrefillPlan

    g = torch.Generator(device="cuda").manual_seed(seed)
    B = len(seqs)
    slots, max_ctx = B + 1, 32768 + 256
    state = torch.randn((slots + 2, 3 * H), generator=g, device="cuda")
    state[:, H:2 * H] = state[:, H:2 * H].abs() + 0.5
    r2t = torch.arange(slots * max_ctx, dtype=torch.int32, device="cuda").view(slots, max_ctx)
    rids = torch.arange(1, B + 1, device="cuda")
    seq = torch.tensor(seqs)
    ext = torch.tensor(exts)
    num_q = sum(exts)
    x = torch.randn((num_q, 2 * H), generator=g, device="cuda")
    ape = 0.5 * torch.randn((128, H), generator=g, device="cuda")
    plan = CompressorPrefillPlan.generate_online(seq_lens=seq, extend_lens=ext, req_pool_indices=rids,
                                                 req_to_token=r2t, num_q_tokens=num_q)
    return state, x, ape, _with_holes(plan, holes)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("holes", [0, 3])
def test_stream_online_prefill_equals_default_tiling(case: str, holes: int) -> None:
    from test_gpu_compress import assert_state_parity

    seqs, exts = CASES[case]
    state, x, ape, plan = _online_world(seqs, exts, holes)
    outs, states = {}, {}
    for name in ("auto", "stream"):
        states[name] = state.clone()
        with tiling(name):
            outs[name] = flashcompress.compress_forward(states[name], x, ape, plan, head_dim=H, compress_ratio=128,
                                                        is_online=True)
    ref_state = state.clone()
    with torch_backend():
        ref = flashcompress.compress_forward(ref_state, x, ape, plan, head_dim=H, compress_ratio=128, is_online=True)
    torch.cuda.synchronize()
    what = f"online {case} holes {holes}"
    _assert_same_bits(outs["stream"], outs["auto"], f"{what}: stream output vs auto")
    _assert_same_bits(states["stream"], states["auto"], f"{what}: stream state vs auto")
    _assert_close_to_reference(outs["stream"], ref, f"{what}: stream output vs torch")
    assert_state_parity(states["stream"], ref_state, state, True, H, f"{what}: stream state vs torch")


def _store_args(num_q: int, max_pos: int, page_size: int = 2) -> dict:
    from flashcompress.layouts import MAIN_V4

    g = torch.Generator(device="cuda").manual_seed(7)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * (160000.0 ** (-torch.arange(0, 64, 2) / 64))[None]
    freq = torch.polar(torch.ones_like(ang), ang).to(torch.complex64).cuda()
    pages = num_q // page_size + 2
    return dict(norm_weight=1.0 + 0.1 * torch.randn((H,), generator=g, device="cuda"), norm_eps=1e-6,
                freq_cis=freq, out_loc=torch.randperm(num_q, generator=g, device="cuda"),
                kvcache=torch.zeros((pages, MAIN_V4.page_bytes(page_size)), dtype=torch.uint8, device="cuda"),
                page_size=page_size, use_fp4=False, bf16_store=False)


@pytest.mark.parametrize("in_dtype,online", [(F32, False), (BF16, False), (F32, True)], ids=["f32", "bf16", "online"])
@pytest.mark.parametrize("case", ["mixed", "long_chunked"])
def test_stream_fused_equals_default_two_step(case: str, in_dtype: torch.dtype, online: bool) -> None:
    seqs, exts = CASES[case]
    if online:
        state, x, ape, plan = _online_world(seqs, exts)
    else:
        state, x, ape, plan, _ = _world(seqs, exts, in_dtype, F32)
    st = _store_args(sum(exts), max(seqs) + 128)
    # the default two-step path
    st_two, cache_two = state.clone(), st["kvcache"].clone()
    with tiling("auto"):
        kv = flashcompress.compress_forward(st_two, x, ape, plan, head_dim=H, compress_ratio=128, is_online=online)
        flashcompress.compress_norm_rope_store(kv, plan, **{**st, "kvcache": cache_two})
    # the stream fused path
    st_fused, cache_fused = state.clone(), st["kvcache"].clone()
    with tiling("stream"):
        flashcompress.compress_and_store(st_fused, x, ape, plan, head_dim=H, compress_ratio=128, is_online=online,
                                         **{**st, "kvcache": cache_fused})
    torch.cuda.synchronize()
    assert bool(cache_two.any()), "nothing stored: the case stores no row"
    _assert_same_bits(st_fused, st_two, f"{case}: state")
    assert torch.equal(cache_fused, cache_two), f"{case}: {int((cache_fused != cache_two).sum())} cache bytes differ"


@pytest.mark.parametrize("online", [False, True], ids=["c128", "online"])
def test_stream_graph_capture_equals_eager_default(online: bool) -> None:
    """The stream pass captured in a CUDA graph (a static host-built plan) replays to the eager
    default tiling's bytes."""
    seqs, exts = CASES["long_chunked"]
    if online:
        state, x, ape, plan = _online_world(seqs, exts, holes=5)
    else:
        state, x, ape, plan, _ = _world(seqs, exts, F32, F32, holes=5)

    def run(st: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return flashcompress.compress_forward(st, x, ape, plan, head_dim=H, compress_ratio=128, out=out,
                                              is_online=online)

    eager_state = state.clone()
    with tiling("auto"):
        want = run(eager_state)
    g_state = state.clone()
    out = torch.full_like(want, float("nan"))
    with tiling("stream"):
        run(state.clone())  # module load outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run(g_state, out)
    for _ in range(2):
        g_state.copy_(state)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _assert_same_bits(out, want, "graph replay output")
        _assert_same_bits(g_state, eager_state, "graph replay state")


def test_stream_graph_planner_padded_plan() -> None:
    """A padded plan of the device (CUDA-graph) planner, a row per token, nearly all invalid,
    keeps pass 1's grid under tiling "stream" (stream_prefill_fits), captured with the planner."""
    from flashcompress import CompressorPrefillPlan

    seqs, exts = CASES["mixed"]
    state, x, ape, _, world = _world(seqs, exts, F32, F32)
    rids, seq, ext, r2t, f2s, ring, num_q = world
    seq, ext = seq.cuda(), ext.cuda()
    pad = 56
    xp = torch.cat([x, torch.randn((pad, 2 * H), device="cuda")])
    plan = CompressorPrefillPlan.generate(128, rids, seq, ext, r2t, f2s, 256, ring, num_q + pad, True, False)
    eager_state = state.clone()
    with tiling("auto"):
        want = flashcompress.compress_forward(eager_state, xp, ape, plan, head_dim=H, compress_ratio=128)
    g_state = state.clone()
    out = torch.full_like(want, float("nan"))
    with tiling("stream"):
        flashcompress.compress_forward(state.clone(), xp, ape, plan, head_dim=H, compress_ratio=128)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            plan_g = CompressorPrefillPlan.generate(128, rids, seq, ext, r2t, f2s, 256, ring, num_q + pad, True, False)
            flashcompress.compress_forward(g_state, xp, ape, plan_g, head_dim=H, compress_ratio=128, out=out)
    graph.replay()
    torch.cuda.synchronize()
    _assert_same_bits(out, want, "padded plan output")
    _assert_same_bits(g_state, eager_state, "padded plan state")


def test_stream_decode_is_the_default_decode() -> None:
    from flashcompress import CompressorDecodePlan

    g = torch.Generator(device="cuda").manual_seed(3)
    B = 64
    slots, ring = B + 1, 128
    state = torch.randn((slots * ring, 2 * H), generator=g, device="cuda")
    r2t = torch.arange(slots * 4096, dtype=torch.int32, device="cuda").view(slots, 4096)
    f2s = torch.arange(slots * 4096 + 1, dtype=torch.int64, device="cuda")
    rids = torch.arange(1, B + 1, device="cuda")
    seq = torch.randint(1, 4000, (B,), generator=g, device="cuda")
    seq[::3] = 128 * torch.randint(1, 30, (len(seq[::3]),), generator=g, device="cuda")  # closing rows
    x = torch.randn((B, 2 * H), generator=g, device="cuda")
    ape = torch.randn((128, H), generator=g, device="cuda")
    plan = CompressorDecodePlan.generate(128, rids, r2t, f2s, seq, 256, ring, False)
    outs, states = [], []
    for name in ("auto", "stream"):
        s = state.clone()
        with tiling(name):
            outs.append(_forward(s, x, ape, plan))
        states.append(s)
    torch.cuda.synchronize()
    _assert_same_bits(outs[1], outs[0], "decode output")
    _assert_same_bits(states[1], states[0], "decode state")


# ---------------------------------------------------------------------------
# Engine simulations (C128 scenarios) through a tee backend
# ---------------------------------------------------------------------------


def _c128_scenarios() -> dict[str, S.Scenario]:
    from test_properties import SCENARIOS

    return {k: v for k, v in SCENARIOS.items() if v.ratio == 128}


class StreamTee:
    """test_gpu_compress.Tee with tiling "stream" (PyTorch parity of every call), plus: each
    C128 / online C128 prefill ``compress_forward`` is also run with the default tiling on clones
    and compared bit for bit; ``compress_and_store`` is compared with the default two-step path."""

    def __init__(self, in_dtype: torch.dtype | None = None):
        from test_gpu_compress import Tee

        self.tee = Tee(in_dtype, "stream")
        self.kernel = self.tee.kernel
        self.compared = 0

    def _stream_prefill(self, call) -> bool:
        return call.plan_w is not None and call.layer.ratio == 128

    def compress_forward(self, call, out):
        if not self._stream_prefill(call):
            return self.tee.compress_forward(call, out)
        inp, ape = self.tee._inputs(call.inp, call.ape)
        c = call._replace(inp=inp, ape=ape)
        kdtype = out.dtype if (self.tee.in_dtype is None or out.dtype == inp.dtype) else inp.dtype
        auto_state = c.state.clone()
        auto_out = torch.full(out.shape, float("nan"), dtype=kdtype, device=out.device)
        self.kernel.compress_forward(c._replace(pool=auto_state), auto_out, tiling="auto")
        self.tee.compress_forward(call, out)  # torch reference, then the stream kernels on the real buffers
        _assert_same_bits(call.state, auto_state, "stream prefill state vs auto")
        _assert_same_bits(out, auto_out.to(out.dtype), "stream prefill output vs auto")
        self.compared += 1

    def compress_norm_rope_store(self, call):
        self.tee.compress_norm_rope_store(call)

    def compress_and_store(self, call):
        from flashcompress import validation as V

        inp, ape = self.tee._inputs(call.inp, call.ape)
        call = call._replace(inp=inp, ape=ape)
        state, plan_rows, st = call.state, call.plan_rows, call.store
        ref_state, ref_cache = state.clone(), st.kvcache.clone()
        kv = torch.full((plan_rows.shape[0], H), float("nan"), dtype=inp.dtype, device=inp.device)
        self.kernel.compress_forward(call._replace(pool=ref_state, store=None), kv, tiling="auto")
        if plan_rows.shape[0]:
            self.kernel.compress_norm_rope_store(V.StoreCall(kv, plan_rows, call.is_decode, call.layer.ratio,
                                                             st._replace(kvcache=ref_cache), call.device))
        self.kernel.compress_and_store(call, tiling="stream")
        if call.is_decode:
            from test_gpu_compress import _settle_shared_decode_rows

            _settle_shared_decode_rows(state, ref_state, inp, plan_rows, call.layer.online, "compress_and_store")
        _assert_same_bits(state, ref_state, "stream compress_and_store state vs default two-step")
        assert torch.equal(st.kvcache, ref_cache), "stream compress_and_store cache bytes differ from the default two-step"
        self.compared += self._stream_prefill(call)


@pytest.fixture()
def stream_tee(monkeypatch: pytest.MonkeyPatch):
    def make(in_dtype: torch.dtype | None = None) -> StreamTee:
        t = StreamTee(in_dtype)
        monkeypatch.setattr(dispatch, "ops_backend", lambda device: t)
        return t

    return make


@pytest.mark.parametrize("name", list(_c128_scenarios()))
@pytest.mark.parametrize("seed", [0, 1])
def test_stream_over_engine_simulation(stream_tee, name: str, seed: int) -> None:
    t = stream_tee()
    res = S.simulate(_c128_scenarios()[name], device="cuda", seed=seed)
    assert t.compared > 0
    assert res.ok, res.summary()


@pytest.mark.parametrize("name", list(_c128_scenarios()))
def test_stream_fused_over_engine_simulation(stream_tee, name: str) -> None:
    t = stream_tee()
    res = S.simulate(dataclasses.replace(_c128_scenarios()[name], fused=True), device="cuda", seed=0)
    assert t.compared > 0
    assert res.ok, res.summary()


@pytest.mark.parametrize("name", ["c128_ring128", "c128_bf16_state"])
def test_stream_bf16_input_over_engine_simulation(stream_tee, name: str) -> None:
    t = stream_tee(torch.bfloat16)
    S.simulate(_c128_scenarios()[name], device="cuda", seed=0)  # the float64 model check does not apply
    assert t.compared > 0


def test_cases_cover_the_ring() -> None:
    """The long case gives each block of the persistent grid more rows than the ring has stages
    (fp32: 3, bf16: 6), so stages are reused with both mbarrier phases."""
    rows = CASES["long_32768"][1][0] // 128
    blocks_per_slice = torch.cuda.get_device_properties(0).multi_processor_count // 8
    assert rows / blocks_per_slice > 2 * 6, (rows, blocks_per_slice)
