"""GPU checks of the compress family's ``tiling="closing"`` (issue 27): the C128 decode kernel that
pools only the window-closing requests with the row copies spread over a one-wave grid
(``jit_kernel/compress_decode_closing.cuh``), and the online C128 decode's shortened chain
(``compress_decode.cuh`` online_decode_row). Prefill calls with this tiling run today's kernels.

C128 (B = 1 .. 1100, so 1-3 plan-scan chunks of 512 rows and up to ~34 closing rows per block
group; random positions, all-boundary, open (none closes), a mix; fp32 / bf16 input and state):

* ``compress_forward`` against the PyTorch backend on CPU copies: state bit-identical, outputs
  within test_gpu_compress's tolerances, non-closing rows exact zeros;
* against the default tiling on the GPU: the same state bits, and for B <= 128 (where the default
  is the per-slice kernel, the same arithmetic) the same output bits;
* ``compress_and_store`` (V4 and bf16 cache rows) with the closing tiling against its two-step
  path: identical state and cache bytes (and, B <= 128, the default tiling's fused bytes);
* CUDA-graph capture of both paths = eager;
* the engine simulations of test_gpu_compress (C128 scenarios) through the tee backend.

Online C128 (B = 1 .. 1024; offsets 0 (no prior), 1..126 (merge), 127 (emit)): the closing
tiling's state, outputs and cache bytes bit-identical to the default tiling's, and its state
within test_gpu_compress's online tolerances of the PyTorch backend.

Run: ``pytest -m gpu tests/test_gpu_dec128.py``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import flashcompress
from test_gpu_compress import (_bits, _decode_plan, _decode_world, _scenarios, assert_out_parity,
                               assert_state_parity, tee)  # noqa: F401  (tee: the fixture)
from flashcompress.testing import simulator as S

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

H = 512
TILING = "closing"


def _seq_lens(B: int, closing: str, g: torch.Generator) -> torch.Tensor:
    if closing == "bnd":  # every request closes a window
        return 128 * torch.randint(2, 30, (B,), generator=g, device="cuda")
    seq = torch.randint(129, 3800, (B,), generator=g, device="cuda")
    seq = torch.where(seq % 128 == 0, seq + 1, seq)  # "open": none closes ...
    if closing == "rand" and B > 1:
        seq[B // 2] = 128 * 7  # ... but one
    elif closing == "mix":  # every third closes
        seq[::3] = 128 * torch.randint(2, 30, (seq[::3].numel(),), generator=g, device="cuda")
    return seq


def _case(B: int, closing: str, in_dtype: torch.dtype, state_dtype: torch.dtype, seed: int = 0):
    state, r2t, f2s, ring = _decode_world(128, B, H, False, seed=seed)
    state = state.to(state_dtype)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    ape = torch.randn((128, H), generator=g, device="cuda").to(in_dtype)
    x = (torch.randn((B, 2 * H), generator=g, device="cuda") * 2.0).to(in_dtype)
    seq = _seq_lens(B, closing, g)
    rids = torch.arange(1, B + 1, device="cuda")
    plan = _decode_plan(128, False, rids, seq, r2t, f2s, ring)
    return state, x, ape, plan, seq, g


DTYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
          (torch.float32, torch.bfloat16)]
DTYPE_IDS = ["f32", "bf16", "bf16in-f32state", "f32in-bf16state"]
# fp32 over every batch size; the other dtype pairs over fewer (each pair is one more kernel build)
CASES = ([pytest.param(B, torch.float32, torch.float32, id=f"B{B}-f32") for B in (1, 2, 33, 128, 129, 512, 1024, 1100)]
         + [pytest.param(B, i, s, id=f"B{B}-{n}") for (i, s), n in zip(DTYPES[1:], DTYPE_IDS[1:]) for B in (1, 129, 1024)])


@pytest.mark.parametrize("closing", ["rand", "bnd", "open", "mix"])
@pytest.mark.parametrize("B,in_dtype,state_dtype", CASES)
def test_closing_decode_matches_torch_and_default(use_tiling, B: int, closing: str, in_dtype: torch.dtype,
                                                  state_dtype: torch.dtype) -> None:
    state, x, ape, plan, seq, _ = _case(B, closing, in_dtype, state_dtype)
    tag = f"closing c128 decode B={B} {closing} {in_dtype} / {state_dtype} state"
    st_gpu, st_cpu, st_def = state.clone(), state.cpu(), state.clone()
    use_tiling("auto")
    out_def = flashcompress.compress_forward(st_def, x, ape, plan, head_dim=H, compress_ratio=128)
    use_tiling(TILING)
    out = flashcompress.compress_forward(st_gpu, x, ape, plan, head_dim=H, compress_ratio=128)
    plan_cpu = type(plan)(128, plan[1].cpu(), is_online=False)
    ref = flashcompress.compress_forward(st_cpu, x.cpu(), ape.cpu(), plan_cpu, head_dim=H, compress_ratio=128)
    assert_out_parity(out.cpu(), ref, f"{tag}: out")
    assert_state_parity(st_gpu.cpu(), st_cpu, state.cpu(), False, H, f"{tag}: state")
    assert torch.equal(_bits(st_gpu), _bits(st_def)), f"{tag}: state differs from the default tiling"
    closes = (seq % 128 == 0).cpu()
    assert bool((out.cpu()[~closes] == 0).all()), f"{tag}: a non-closing row is not zeros"
    if closing in ("rand", "bnd", "mix"):
        assert bool((ref[closes] != 0).any(dim=1).all()), f"{tag}: a closing row pooled to zeros (test data)"
    if B <= 128:  # the default is the per-slice kernel: the same arithmetic
        assert torch.equal(_bits(out), _bits(out_def)), f"{tag}: out differs from the per-slice kernel"


def _store_kw(B: int, seq: torch.Tensor, g: torch.Generator, bf16_store: bool):
    from flashcompress.layouts import select_cache_format
    from flashcompress.testing.oracle import deepseek_v4_freq_cis

    freq = deepseek_v4_freq_cis(int(seq.max()) + 1).cuda()
    w = torch.randn((H,), generator=g, device="cuda") * 0.1 + 1.0
    out_loc = torch.randperm(2 * B, generator=g, device="cuda")[:B]
    page = 2
    fmt = select_cache_format(H, use_fp4=False, bf16_store=bf16_store)
    cache0 = torch.randint(0, 256, (-(-2 * B // page), fmt.page_bytes(page)), generator=g, device="cuda",
                           dtype=torch.uint8)
    kw = dict(norm_weight=w, norm_eps=1e-6, freq_cis=freq, out_loc=out_loc, page_size=page, use_fp4=False,
              bf16_store=bf16_store)
    return kw, cache0, fmt


@pytest.mark.parametrize("bf16_store", [False, True], ids=["v4", "bf16"])
@pytest.mark.parametrize("in_dtype,state_dtype", DTYPES[:2], ids=DTYPE_IDS[:2])
@pytest.mark.parametrize("closing", ["rand", "bnd", "mix"])
@pytest.mark.parametrize("B", [1, 2, 33, 128, 512, 1024, 1100])
def test_closing_fused_decode_equals_two_step(use_tiling, B: int, closing: str, in_dtype: torch.dtype,
                                              state_dtype: torch.dtype, bf16_store: bool) -> None:
    state, x, ape, plan, seq, g = _case(B, closing, in_dtype, state_dtype, seed=5)
    kw, cache0, fmt = _store_kw(B, seq, g, bf16_store)
    use_tiling(TILING)
    two_state, two_cache = state.clone(), cache0.clone()
    kv = flashcompress.compress_forward(two_state, x, ape, plan, head_dim=H, compress_ratio=128)
    flashcompress.compress_norm_rope_store(kv, plan, kvcache=two_cache, **kw)
    f_state, f_cache = state.clone(), cache0.clone()
    flashcompress.compress_and_store(f_state, x, ape, plan, head_dim=H, compress_ratio=128, kvcache=f_cache, **kw)
    what = f"closing c128 fused decode B={B} {closing} {in_dtype} {fmt.name}"
    assert torch.equal(_bits(f_state), _bits(two_state)), f"{what}: state"
    diff = (f_cache != two_cache).nonzero()
    assert diff.numel() == 0, f"{what}: {diff.shape[0]} cache bytes differ, first at {diff[0].tolist()}"
    if bool((seq % 128 == 0).any()):
        assert not torch.equal(f_cache, cache0), f"{what}: nothing stored"
    if B <= 128:  # the default tiling's per-slice kernel writes the same bytes
        use_tiling("auto")
        d_state, d_cache = state.clone(), cache0.clone()
        flashcompress.compress_and_store(d_state, x, ape, plan, head_dim=H, compress_ratio=128, kvcache=d_cache,
                                         **kw)
        assert torch.equal(d_cache, f_cache), f"{what}: cache differs from the default tiling"
        assert torch.equal(_bits(d_state), _bits(f_state)), f"{what}: state differs from the default tiling"


def _graph_equals_eager(fn, state: torch.Tensor, outs: list[torch.Tensor], what: str) -> None:
    """Capture fn(state_buffer) in a CUDA graph, replay it on a copy of `state` and compare the
    state and every tensor of `outs` (fn's other written buffers, restored before each run) with
    an eager run."""
    init = [o.clone() for o in outs]
    e_state = state.clone()
    fn(e_state)
    want = [o.clone() for o in outs]
    for o, i in zip(outs, init):
        o.copy_(i)
    g_state = state.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture (module load, occupancy query)
        fn(state.clone())
    torch.cuda.current_stream().wait_stream(s)
    for o, i in zip(outs, init):
        o.copy_(i)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(g_state)
    g_state.copy_(state)
    for o, i in zip(outs, init):
        o.copy_(i)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(_bits(g_state), _bits(e_state)), f"{what}: graph state differs from eager"
    for o, w in zip(outs, want):
        assert torch.equal(o, w), f"{what}: graph output differs from eager"


@pytest.mark.parametrize("closing", ["rand", "bnd"])
@pytest.mark.parametrize("B", [1, 512])
def test_closing_decode_graph_capture(use_tiling, B: int, closing: str) -> None:
    state, x, ape, plan, seq, g = _case(B, closing, torch.float32, torch.float32, seed=9)
    kw, cache0, _ = _store_kw(B, seq, g, False)
    use_tiling(TILING)
    out = torch.empty((B, H), device="cuda")
    _graph_equals_eager(lambda st: flashcompress.compress_forward(st, x, ape, plan, head_dim=H, compress_ratio=128,
                                                                  out=out),
                        state, [out], f"closing compress_forward B={B} {closing}")
    cache = cache0.clone()
    _graph_equals_eager(lambda st: flashcompress.compress_and_store(st, x, ape, plan, head_dim=H, compress_ratio=128,
                                                                    kvcache=cache, **kw),
                        state, [cache], f"closing compress_and_store B={B} {closing}")


@pytest.mark.parametrize("name", [n for n in _scenarios() if "c128" in n])
def test_closing_engine_simulation(tee, name: str) -> None:  # noqa: F811  (tee: the fixture)
    t = tee(tiling=TILING)
    res = S.simulate(_scenarios()[name], device="cuda", seed=0)
    assert t.calls["compress_forward"] > 0
    assert res.ok, res.summary()
    t = tee(tiling=TILING)
    res = S.simulate(dataclasses.replace(_scenarios()[name], fused=True), device="cuda", seed=0)
    assert t.calls["compress_and_store"] > 0
    assert res.ok, res.summary()


# ------------------------------------------------------------------------------ online C128


def _online_case(B: int, offsets: str, seed: int = 0):
    state, r2t, f2s, ring = _decode_world(128, B, H, True, seed=seed)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    ape = torch.randn((128, H), generator=g, device="cuda")
    x = torch.randn((B, 2 * H), generator=g, device="cuda") * 2.0
    base = 128 * torch.randint(1, 30, (B,), generator=g, device="cuda")
    if offsets == "rand":  # offsets (seq_len - 1) % 128 anywhere: fresh, merging and emitting rows
        seq = base + torch.randint(1, 129, (B,), generator=g, device="cuda")
        seq[: min(B, 3)] = torch.tensor([129, 128, 200], device="cuda")[: min(B, 3)]
    elif offsets == "bnd":  # every row emits (offset 127)
        seq = base
    else:  # "fresh": every row starts a window (offset 0: no prior state)
        seq = base + 1
    rids = torch.arange(1, B + 1, device="cuda")
    plan = _decode_plan(128, True, rids, seq, r2t, f2s, ring)
    return state, x, ape, plan, seq, g


@pytest.mark.parametrize("offsets", ["rand", "bnd", "fresh"])
@pytest.mark.parametrize("B", [1, 33, 512, 1024])
def test_online_closing_decode_bits_equal_default(use_tiling, B: int, offsets: str) -> None:
    state, x, ape, plan, seq, _ = _online_case(B, offsets)
    tag = f"online decode B={B} {offsets}"
    st_def, st_new, st_cpu = state.clone(), state.clone(), state.cpu()
    use_tiling("auto")
    out_def = flashcompress.compress_forward(st_def, x, ape, plan, head_dim=H, compress_ratio=128, is_online=True)
    use_tiling(TILING)
    out = flashcompress.compress_forward(st_new, x, ape, plan, head_dim=H, compress_ratio=128, is_online=True)
    assert torch.equal(_bits(st_new), _bits(st_def)), f"{tag}: state differs from the default tiling"
    assert torch.equal(_bits(out), _bits(out_def)), f"{tag}: out differs from the default tiling"
    plan_cpu = type(plan)(128, plan[1].cpu(), is_online=True)
    ref = flashcompress.compress_forward(st_cpu, x.cpu(), ape.cpu(), plan_cpu, head_dim=H, compress_ratio=128,
                                         is_online=True)
    assert_state_parity(st_new.cpu(), st_cpu, state.cpu(), True, H, f"{tag}: state")
    assert_out_parity(out.cpu(), ref, f"{tag}: out")


@pytest.mark.parametrize("offsets", ["rand", "bnd"])
@pytest.mark.parametrize("B", [1, 512])
def test_online_closing_fused_equals_two_step_and_default(use_tiling, B: int, offsets: str) -> None:
    state, x, ape, plan, seq, g = _online_case(B, offsets, seed=3)
    kw, cache0, _ = _store_kw(B, seq, g, False)
    what = f"online fused decode B={B} {offsets}"
    results = {}
    for tiling in ("auto", TILING):
        use_tiling(tiling)
        f_state, f_cache = state.clone(), cache0.clone()
        flashcompress.compress_and_store(f_state, x, ape, plan, head_dim=H, compress_ratio=128, kvcache=f_cache,
                                         is_online=True, **kw)
        t_state, t_cache = state.clone(), cache0.clone()
        kv = flashcompress.compress_forward(t_state, x, ape, plan, head_dim=H, compress_ratio=128, is_online=True)
        flashcompress.compress_norm_rope_store(kv, plan, kvcache=t_cache, **kw)
        assert torch.equal(_bits(f_state), _bits(t_state)), f"{what} {tiling}: state"
        assert torch.equal(f_cache, t_cache), f"{what} {tiling}: cache bytes differ from the two-step path"
        results[tiling] = (f_state, f_cache)
    assert torch.equal(_bits(results["auto"][0]), _bits(results[TILING][0])), f"{what}: state differs by tiling"
    assert torch.equal(results["auto"][1], results[TILING][1]), f"{what}: cache differs by tiling"
    if offsets == "bnd":
        assert not torch.equal(results[TILING][1], cache0), f"{what}: nothing stored"


def test_online_closing_graph_capture(use_tiling) -> None:
    state, x, ape, plan, seq, g = _online_case(512, "rand", seed=4)
    kw, cache0, _ = _store_kw(512, seq, g, False)
    use_tiling(TILING)
    cache = cache0.clone()
    _graph_equals_eager(lambda st: flashcompress.compress_and_store(st, x, ape, plan, head_dim=H, compress_ratio=128,
                                                                    kvcache=cache, is_online=True, **kw),
                        state, [cache], "online closing compress_and_store B=512")
