"""GPU store kernels (the ``store`` JIT family) against the PyTorch backend and the golden bytes.

Run on a CUDA machine with ``pytest -m gpu tests/test_gpu_store.py -s`` (``-s`` shows the
code-mismatch counts); skipped cleanly without one.  The reference is always
``flashcompress.torch_backend`` on CPU copies of the same inputs.  Covered: every format x
row dtype x decode / prefill plan (skipped decode rows, invalid prefill rows, ignored plan
fields), poisoned caches (bytes outside the written entries unchanged), code-mismatch
counting (<= 0.1%, each exactly one code step), a 32768-row graph-padded prefill, the
golden vectors byte for byte, the device encoders over a dense fp32 grid (the hardware
e4m3 path), CUDA-graph capture + replay equal to eager, a side stream, no host
synchronisation (``torch.cuda.set_sync_debug_mode("error")``), the binding's errors, and
``FLASHCOMPRESS_DEBUG=1`` rejecting an ``out_loc`` past the cache before anything is written.
"""

from __future__ import annotations

import pytest
import torch

from _golden import load_golden
from _store_cases import FORMATS, POISON, StoreCase, compare_store, make_case, reference_cache, store_call
from flashcompress import layouts as L
from flashcompress.torch_backend import quant as Q

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DEV = torch.device("cuda") if torch.cuda.is_available() else None
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


@pytest.fixture(scope="module")
def st():
    from flashcompress.cuda_ops import store

    return store


def run_gpu(st, case: StoreCase, cache: torch.Tensor | None = None) -> torch.Tensor:
    """The GPU kernel's cache after the store of ``case`` (inputs copied to the GPU)."""
    cache = case.cache.to(DEV) if cache is None else cache
    st.compress_norm_rope_store(store_call(case.kv.to(DEV), case.plan.to(DEV), **case.kwargs(DEV, cache)))
    torch.cuda.synchronize()
    return cache


CASES = [(fmt, dtype, decode) for fmt in FORMATS for dtype in DTYPES for decode in (True, False)]


@pytest.mark.parametrize("fmt,dtype,decode", CASES, ids=[f"{f}-{d}-{'decode' if m else 'prefill'}" for f, d, m in CASES])
@pytest.mark.parametrize("rows", [1, 37, 700])
def test_parity_with_torch_backend(st, fmt: str, dtype: str, decode: bool, rows: int) -> None:
    for ratio, page_size in ([(4, 64), (128, 2)] if fmt == "v4" else [(4, 64 if rows > 1 else 1)]):
        case = make_case(fmt, DTYPES[dtype], decode, rows=rows, ratio=ratio, page_size=page_size,
                         seed=rows * 31 + CASES.index((fmt, dtype, decode)))
        want = reference_cache(case)
        got = run_gpu(st, case)
        cmp = compare_store(got, want, case.cache, case)
        print(f"{fmt}/{dtype}/{'decode' if decode else 'prefill'} rows={rows} ratio={ratio} P={page_size}: "
              f"{cmp.report()}")
        assert cmp.ok, cmp.report()


@pytest.mark.parametrize("fmt", ["v4", "idx_fp8", "idx_fp4"])
def test_large_padded_prefill(st, fmt: str) -> None:
    """32768 plan rows, a quarter of them valid (the graph-padded 32768-token C4 prefill)."""
    gen = torch.Generator().manual_seed(5)
    n, ratio, page_size = 32768, 4, 64
    f = FORMATS[fmt]
    kv = torch.randn((n, f.head_dim), generator=gen)
    plan = torch.tensor(list(L.INVALID_COMPRESS_ROW) * n, dtype=torch.uint8).reshape(n, 16)
    valid_rows = torch.arange(0, n, 4)
    seq = (valid_rows + ratio).to(torch.int32)  # ragged token t = row ends a group: seq_len t + 4
    plan[valid_rows, 0:4] = seq.view(torch.uint8).reshape(-1, 4)
    plan[valid_rows, 4:6] = valid_rows.to(torch.int16).view(torch.uint8).reshape(-1, 2)
    plan[valid_rows, 6:8] = 0
    pages = n // ratio // page_size + 2
    out_loc = torch.zeros(n, dtype=torch.int64)
    out_loc[valid_rows] = torch.randperm(pages * page_size, generator=gen)[: valid_rows.numel()]
    freq = torch.polar(torch.ones(n + 8, 32), torch.rand((n + 8, 32), generator=gen) * 6.28)
    cache = torch.full((pages, f.page_bytes(page_size)), POISON, dtype=torch.uint8)
    case = StoreCase(f, False, ratio, page_size, kv, plan, out_loc, 1 + 0.2 * torch.randn(f.head_dim, generator=gen),
                     1e-6, freq, cache)
    want = reference_cache(case)
    got = run_gpu(st, case)
    cmp = compare_store(got, want, case.cache, case)
    print(f"{fmt} 32768-row prefill: {cmp.report()}")
    assert cmp.ok, cmp.report()


GOLDEN = ["store_v4_c4_p64.pt", "store_v4_c128_p2.pt", "store_idx_fp8_p64.pt", "store_idx_fp4_p64.pt",
          "store_bf16_c4_p1.pt"]


@pytest.mark.parametrize("call", ["decode", "prefill"])
@pytest.mark.parametrize("name", GOLDEN)
def test_golden_byte_for_byte(st, name: str, call: str) -> None:
    d = load_golden(f"store/{name}")
    fmt = L.select_cache_format(d["head_dim"], d["use_fp4"], d["bf16_store"])
    case = StoreCase(fmt, d[f"{call}.is_decode"], d["compress_ratio"], d["page_size"], d[f"{call}.kv"],
                     d[f"{call}.plan"], d[f"{call}.out_loc"], d["norm_weight"], d["norm_eps"], d["freq_cis"],
                     d["kvcache_before"])
    got = run_gpu(st, case).cpu()
    want = d[f"{call}.kvcache_after"]
    cmp = compare_store(got, want, case.cache, case, exact=True)
    assert torch.equal(got, want), cmp.report()


def test_device_encoders_match_reference() -> None:
    """The selftest family's quant_probe runs the device encoders (incl. the sm_89+ cvt e4m3 path)
    over a dense fp32 grid."""
    from flashcompress.jit import get_module

    high = torch.arange(1 << 20, dtype=torch.int64) << 12
    low = torch.tensor([0x000, 0x001, 0x7FF, 0x800, 0x801, 0xFFF], dtype=torch.int64)
    bits = (high[:, None] | low[None, :]).reshape(-1)
    x = torch.where(bits >= 1 << 31, bits - (1 << 32), bits).to(torch.int32).view(torch.float32)
    mod = get_module("selftest", value=0, block=256)
    out = torch.empty((x.numel(), 4), dtype=torch.uint8, device=DEV)
    mod.quant_probe(x.to(DEV), out)
    out = out.cpu()
    checks = {
        "pack_fp8": (out[:, 0], Q.e4m3_codes(x, clip=True)),
        "e2m1_threshold": (out[:, 1], Q.e2m1_threshold_codes(x)),
        "bf16_bits": (out[:, 2:4].contiguous().view(torch.int16).reshape(-1), Q.bf16_bits(x)),
    }
    for name, (got, want) in checks.items():
        bad = (got != want).nonzero().flatten()
        assert bad.numel() == 0, (f"{name}: {bad.numel()} differ; first x = {float(x[bad[0]])!r}: "
                                  f"got {int(got[bad[0]])}, want {int(want[bad[0]])}")


def test_cuda_graph_capture_and_replay(st) -> None:
    """A captured decode store replays with refreshed inputs exactly like eager calls."""
    cases = [make_case("v4", torch.float32, True, rows=64, ratio=4, page_size=64, seed=s) for s in (1, 2)]
    static = {k: v.to(DEV) for k, v in (("kv", cases[0].kv), ("plan", cases[0].plan), ("out_loc", cases[0].out_loc))}
    weight, freq = cases[0].norm_weight.to(DEV), cases[0].freq_cis.to(DEV)
    cache = cases[0].cache.to(DEV)
    kw = dict(is_decode=True, ratio=4, norm_weight=weight, norm_eps=1e-6, freq_cis=freq, page_size=64, fmt=L.MAIN_V4)
    # warm up (module load) outside the capture, on a side stream as torch recommends
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        st.compress_norm_rope_store(store_call(static["kv"], static["plan"], out_loc=static["out_loc"], kvcache=cache.clone(), **kw))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        st.compress_norm_rope_store(store_call(static["kv"], static["plan"], out_loc=static["out_loc"], kvcache=cache, **kw))
    for case in cases:
        cache.copy_(case.cache.to(DEV))
        static["kv"].copy_(case.kv.to(DEV))
        static["plan"].copy_(case.plan.to(DEV))
        static["out_loc"].copy_(case.out_loc.to(DEV))
        graph.replay()
        eager = case.cache.to(DEV)
        st.compress_norm_rope_store(store_call(case.kv.to(DEV), case.plan.to(DEV), out_loc=case.out_loc.to(DEV),
                                    kvcache=eager, **kw))
        torch.cuda.synchronize()
        assert torch.equal(cache, eager)
        assert not torch.equal(cache.cpu(), case.cache)


def test_side_stream_and_no_host_sync(st) -> None:
    case = make_case("idx_fp8", torch.float32, False, rows=50, seed=9)
    want = reference_cache(case)
    args = (case.kv.to(DEV), case.plan.to(DEV))
    kw = case.kwargs(DEV)
    st.compress_norm_rope_store(store_call(*args, **case.kwargs(DEV)))  # load the module first
    torch.cuda.synchronize()
    # bf16 weight with fp32 rows: the weight cast is the only extra work, still no sync
    kw2 = dict(kw, norm_weight=kw["norm_weight"].to(torch.bfloat16), kvcache=case.cache.to(DEV))
    case2 = StoreCase(**{**case.__dict__, "norm_weight": case.norm_weight.to(torch.bfloat16)})
    want2 = reference_cache(case2)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.stream(side):
            st.compress_norm_rope_store(store_call(*args, **kw))
            st.compress_norm_rope_store(store_call(*args, **kw2))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    side.synchronize()
    for got, ref, c in ((kw["kvcache"], want, case), (kw2["kvcache"], want2, case2)):
        cmp = compare_store(got, ref, c.cache, c)
        assert cmp.ok, cmp.report()


def test_binding_errors_on_cuda_tensors(st) -> None:
    case = make_case("v4", torch.float32, True, rows=4, seed=4)
    mod = st.store_module(L.MAIN_V4, torch.float32)
    kv, plan = case.kv.to(DEV), case.plan.to(DEV)
    w = case.norm_weight.to(DEV)
    freq = torch.view_as_real(case.freq_cis).flatten(-2).contiguous().to(DEV)
    loc, cache = case.out_loc.to(DEV), case.cache.to(DEV)
    base = [kv, plan, w, 1e-6, freq, loc, cache, case.page_size, True, 4]

    def call(i: int, value):
        args = list(base)
        args[i] = value
        mod.forward(*args)

    with pytest.raises(TypeError, match="kv: expected dtype float32, got bfloat16"):
        call(0, kv.to(torch.bfloat16))
    with pytest.raises(ValueError, match="plan: expected shape"):
        call(1, plan[:3])
    with pytest.raises(ValueError, match="out_loc: expected 4 entries"):
        call(5, loc[:3])
    with pytest.raises(ValueError, match="kvcache: expected shape"):
        call(7, 8)  # page_size 8: pages of a different size
    with pytest.raises(ValueError, match="page_size: expected a power of two"):
        call(7, 3)
    with pytest.raises(ValueError, match="ratio: expected a power of two, got 12"):
        call(9, 12)  # decode tests seq_len % ratio by a mask
    with pytest.raises(ValueError, match="kv: data must be 16-byte aligned"):
        call(0, torch.zeros(4 * 512 + 1, device=DEV)[1:].view(4, 512))
    torch.cuda.synchronize()
    assert torch.equal(cache.cpu(), case.cache), "a rejected call wrote to the cache"


def test_public_api_on_cuda_matches_cpu_and_debug_rejects_out_of_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end through flashcompress.compress_norm_rope_store (whichever backend dispatch picks)."""
    import flashcompress
    from flashcompress import CompressorDecodePlan

    case = make_case("v4", torch.float32, True, rows=16, ratio=4, page_size=64, seed=12)
    kw = dict(norm_weight=case.norm_weight, norm_eps=1e-6, freq_cis=case.freq_cis, page_size=64)
    cpu_cache = case.cache.clone()
    flashcompress.compress_norm_rope_store(case.kv, CompressorDecodePlan(4, case.plan), out_loc=case.out_loc,
                                           kvcache=cpu_cache, **kw)
    gpu_kw = {k: (v.to(DEV) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    gpu_cache = case.cache.to(DEV)
    flashcompress.compress_norm_rope_store(case.kv.to(DEV), CompressorDecodePlan(4, case.plan.to(DEV)),
                                           out_loc=case.out_loc.to(DEV), kvcache=gpu_cache, **gpu_kw)
    cmp = compare_store(gpu_cache, cpu_cache, case.cache, case)
    assert cmp.ok, cmp.report()

    from flashcompress.jit import settings

    monkeypatch.setenv("FLASHCOMPRESS_DEBUG", "1")
    if hasattr(settings, "forget_settings"):
        settings.forget_settings()
    monkeypatch.setattr(settings, "_DEBUG", None, raising=False)
    try:
        valid, _, _ = case.targets()
        bad_loc = case.out_loc.clone()
        bad_loc[int(valid.nonzero()[0])] = case.cache.shape[0] * 64  # one past the last slot
        poisoned = case.cache.to(DEV)
        with pytest.raises(ValueError, match="out_loc"):
            flashcompress.compress_norm_rope_store(case.kv.to(DEV), CompressorDecodePlan(4, case.plan.to(DEV)),
                                                   out_loc=bad_loc.to(DEV), kvcache=poisoned, **gpu_kw)
        torch.cuda.synchronize()
        assert torch.equal(poisoned.cpu(), case.cache), "bytes were written before the out_loc check"
    finally:
        monkeypatch.delenv("FLASHCOMPRESS_DEBUG")
        if hasattr(settings, "forget_settings"):
            settings.forget_settings()
        monkeypatch.setattr(settings, "_DEBUG", None, raising=False)
