"""The CUDA store kernel's V4.1 layouts (``compress_norm_rope_store(..., layout=...)``) on a GPU.

Run with ``pytest -m gpu tests/test_gpu_v41store.py -s``; skipped without a CUDA GPU.  The
reference is the PyTorch backend on CPU copies of the same inputs, byte for byte:

* every V4.1 layout x fp32 / bf16 rows x decode / prefill x C4 (page 64) / C128 (page 2), for
  launches of 1, 37 and 1500 rows (the 4-warp teams of launches up to 1024 rows and the
  one-warp rows above);
* the public API on CUDA tensors (the full path, then the learnt fast path) equals the CPU call;
* ``compress_and_store(layout=...)`` on CUDA runs compress, then the store kernel (the routing
  is checked) and writes the CPU reference's state and cache bytes, decode and prefill;
* a captured decode store in a V4.1 layout replays like eager calls;
* a cache sized for another layout is refused before anything is written.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import flashcompress as fc
from _store_cases import compare_store, make_case, reference_cache, store_call
from flashcompress.v41.layouts import KVLayout

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = torch.device("cuda") if torch.cuda.is_available() else None
LAYOUTS = [x for x in KVLayout if x is not KVLayout.V4]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
MODES = [(4, 64), (128, 2)]
CASES = [(x, d, decode, mode) for x in LAYOUTS for d in DTYPES for decode in (True, False) for mode in MODES]


def _id(c) -> str:
    x, d, decode, (ratio, page) = c
    return f"{x.value}-{d}-{'decode' if decode else 'prefill'}-c{ratio}p{page}"


@pytest.fixture(scope="module")
def st():
    from flashcompress.cuda_ops import store

    return store


def _plan(case):
    if case.is_decode:
        return fc.CompressorDecodePlan(case.ratio, case.plan)
    return fc.CompressorPrefillPlan(case.ratio, case.plan, torch.zeros((0, 8), dtype=torch.uint8))


def _to(plan, dev):
    if isinstance(plan, fc.CompressorDecodePlan):
        return fc.CompressorDecodePlan(plan[0], plan[1].to(dev))
    return fc.CompressorPrefillPlan(plan[0], plan[1].to(dev), plan[2].to(dev))


@pytest.mark.parametrize("rows", [1, 37, 1500])
@pytest.mark.parametrize("case_id", CASES, ids=[_id(c) for c in CASES])
def test_cuda_bytes_equal_torch_bytes(st, case_id, rows: int) -> None:
    layout, dtype, decode, (ratio, page_size) = case_id
    case = make_case(layout.value, DTYPES[dtype], decode, rows=rows, ratio=ratio, page_size=page_size,
                     seed=rows * 97 + CASES.index(case_id))
    want = reference_cache(case)
    got = case.cache.to(DEV)
    st.compress_norm_rope_store(store_call(case.kv.to(DEV), case.plan.to(DEV), **case.kwargs(DEV, got)))
    torch.cuda.synchronize()
    cmp = compare_store(got, want, case.cache, case, exact=True)
    print(f"{_id(case_id)} rows={rows}: {cmp.report()}")
    assert cmp.ok and torch.equal(got.cpu(), want), cmp.report()


@pytest.mark.parametrize("decode", [True, False], ids=["decode", "prefill"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=[x.value for x in LAYOUTS])
def test_public_api_on_cuda_equals_cpu(layout: KVLayout, decode: bool) -> None:
    case = make_case(layout.value, torch.float32, decode, rows=48, ratio=4, page_size=64, seed=7)
    kw = dict(norm_weight=case.norm_weight, norm_eps=case.norm_eps, freq_cis=case.freq_cis, out_loc=case.out_loc,
              page_size=case.page_size)
    want = case.cache.clone()
    fc.compress_norm_rope_store(case.kv, _plan(case), kvcache=want, layout=layout.value, **kw)
    gkw = {k: v.to(DEV) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    plan = _to(_plan(case), DEV)
    for spelling in (layout.value, layout, layout.value.upper()):  # full path, then the fast path
        got = case.cache.to(DEV)
        fc.compress_norm_rope_store(case.kv.to(DEV), plan, kvcache=got, layout=spelling, **gkw)
        torch.cuda.synchronize()
        assert torch.equal(got.cpu(), want), spelling


@pytest.mark.parametrize("ratio,decode", [(4, True), (4, False), (128, True), (128, False)],
                         ids=["c4-decode", "c4-prefill", "c128-decode", "c128-prefill"])
@pytest.mark.parametrize("layout", [KVLayout.V41, KVLayout.V41_FP4_NEW], ids=["v41", "v41_fp4_new"])
def test_compress_and_store_runs_the_two_steps(monkeypatch: pytest.MonkeyPatch, layout: KVLayout, ratio: int,
                                               decode: bool) -> None:
    from flashcompress.cuda_ops import compress as cc
    from flashcompress.cuda_ops import store as cs
    from test_v41_store_layouts import _compress_world

    page_size = 2 if ratio == 128 else 4
    w = _compress_world(ratio, decode, seed=ratio + decode)
    pages = -(-(int(w["out_loc"].max()) + 1) // page_size)
    cache = torch.full((pages, layout.page_bytes(page_size)), 0xA5, dtype=torch.uint8)
    state = w.pop("kv_score_buffer")
    want_state, want_cache = state.clone(), cache.clone()
    fc.compress_and_store(want_state, **w, kvcache=want_cache, page_size=page_size, layout=layout)

    stores = []
    real = cs.compress_norm_rope_store
    monkeypatch.setattr(cs, "compress_norm_rope_store", lambda call: stores.append(call.store.fmt.name) or real(call))
    g = {k: (v.to(DEV) if isinstance(v, torch.Tensor) else v) for k, v in w.items() if k != "plan"}
    got_state, got_cache = state.to(DEV), cache.to(DEV)
    fc.compress_and_store(got_state, **g, plan=_to(w["plan"], DEV), kvcache=got_cache, page_size=page_size,
                          layout=layout.value)
    torch.cuda.synchronize()
    assert stores == [layout.value]  # the store kernel wrote the layout (no fused epilogue variant)
    assert torch.equal(got_state.cpu(), want_state) and torch.equal(got_cache.cpu(), want_cache)
    assert not torch.equal(want_cache, cache)
    assert cc.EPILOGUE_FORMATS.isdisjoint({x.value for x in LAYOUTS})


def test_cuda_graph_capture_and_replay() -> None:
    """A captured decode store into a v41_fp4 cache (public API) replays with refreshed inputs like eager."""
    cases = [make_case("v41_fp4", torch.float32, True, rows=64, ratio=4, page_size=64, seed=s) for s in (1, 2)]
    # the graph holds the first case's weight and RoPE table: the second case refreshes the rows only
    cases[1] = dataclasses.replace(cases[1], norm_weight=cases[0].norm_weight, freq_cis=cases[0].freq_cis)
    static = {k: getattr(cases[0], k).to(DEV) for k in ("kv", "plan", "out_loc")}
    weight, freq = cases[0].norm_weight.to(DEV), cases[0].freq_cis.to(DEV)
    cache = cases[0].cache.to(DEV)
    plan = fc.CompressorDecodePlan(4, static["plan"])

    def store(kv, plan, out_loc, kvcache):
        fc.compress_norm_rope_store(kv, plan, norm_weight=weight, norm_eps=1e-6, freq_cis=freq, out_loc=out_loc,
                                    kvcache=kvcache, page_size=64, layout="v41_fp4")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (module load, fast-path key) outside the capture
        for _ in range(2):
            store(static["kv"], plan, static["out_loc"], cache.clone())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        store(static["kv"], plan, static["out_loc"], cache)
    for case in cases:
        cache.copy_(case.cache.to(DEV))
        for k in static:
            static[k].copy_(getattr(case, k).to(DEV))
        graph.replay()
        eager = case.cache.to(DEV)
        store(case.kv.to(DEV), fc.CompressorDecodePlan(4, case.plan.to(DEV)), case.out_loc.to(DEV), eager)
        torch.cuda.synchronize()
        assert torch.equal(cache, eager)
        assert torch.equal(cache.cpu(), reference_cache(case))


def test_a_cache_of_another_layout_is_refused_before_any_write() -> None:
    case = make_case("v41", torch.float32, True, rows=8, ratio=4, page_size=64, seed=3)
    plan = fc.CompressorDecodePlan(4, case.plan.to(DEV))
    for layout in ("v41", "v41_new"):  # the same call is accepted once, so the key is learnt
        cache = case.cache.to(DEV)
        fc.compress_norm_rope_store(case.kv.to(DEV), plan, norm_weight=case.norm_weight.to(DEV), norm_eps=1e-6,
                                    freq_cis=case.freq_cis.to(DEV), out_loc=case.out_loc.to(DEV), kvcache=cache,
                                    page_size=64, layout=layout)
    wrong = torch.full((case.cache.shape[0], KVLayout.V41_FP4.page_bytes(64)), 0xA5, dtype=torch.uint8, device=DEV)
    before = wrong.clone()
    with pytest.raises(ValueError, match=r"^kvcache: expected \[pages, 33792\]"):
        fc.compress_norm_rope_store(case.kv.to(DEV), plan, norm_weight=case.norm_weight.to(DEV), norm_eps=1e-6,
                                    freq_cis=case.freq_cis.to(DEV), out_loc=case.out_loc.to(DEV), kvcache=wrong,
                                    page_size=64, layout="v41")
    torch.cuda.synchronize()
    assert torch.equal(wrong, before)
