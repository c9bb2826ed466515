"""The ``v41`` CUDA kernels against the PyTorch backend, byte for byte (``pytest -m gpu``).

Every call runs twice through the public API, on CPU tensors (the PyTorch backend) and on
CUDA copies (the kernels), and every tensor it may write (latent ``out``, pair ring, caches,
poisoned beforehand) must come back with identical bits: every layout, int32 / int64
metadata, both eps values, padding rows and sentinels, verify blocks, prefill write-back,
page sizes, a chunked schedule through the kernels, CUDA-graph capture of decode calls.
The golden vectors run through the kernels in ``tests/test_v41_golden.py -m gpu`` (its
``cuda`` parameter).
"""

from __future__ import annotations

import pytest
import torch

import flashcompress as fc
from flashcompress.v41.layouts import KVLayout

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

L = KVLayout
BF16 = torch.bfloat16
TABLE_ROWS = 4096
POISON = 0xA5


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _freqs(rows: int = TABLE_ROWS) -> torch.Tensor:
    theta = torch.arange(rows).double()[:, None] * 10000.0 ** (-torch.arange(32).double() / 32)
    f = torch.empty(rows, 64)
    f[:, 0::2], f[:, 1::2] = torch.cos(theta).float(), torch.sin(theta).float()
    return f


def _weight(seed: int = 0, dim: int = 512) -> torch.Tensor:
    return (1 + 0.25 * torch.randn(dim, generator=_gen(seed))).to(BF16)


def _latent_rows(n: int, seed: int, dim: int = 512) -> torch.Tensor:
    g = _gen(seed)
    mag = 10.0 ** torch.randint(-3, 3, (n, 1), generator=g).float()
    x = torch.randn(n, dim, generator=g) * mag
    x[: min(n, 2), :16] = 0.0  # all-zero quantisation blocks (scale floors)
    return x.to(BF16)


def _kv_rows(n: int, seed: int) -> torch.Tensor:
    g = _gen(seed)
    kv = torch.randn(n, 512, generator=g) * 10.0 ** torch.randint(-2, 2, (n, 1), generator=g).float()
    return torch.cat((kv, torch.randn(n, 512, generator=g) * 3), 1)


def _ring(rows: int, seed: int | None = None) -> torch.Tensor:
    state = torch.zeros(rows, 1024)
    state[:, 512:] = float("-inf")
    if seed is not None:  # some rows hold parked partners
        g = _gen(seed)
        filled = torch.randperm(rows, generator=g)[: rows // 2]
        state[filled] = _kv_rows(filled.numel(), seed + 1)
    return state


def _cache(layout: KVLayout, page_size: int, pages: int) -> torch.Tensor:
    return torch.full((pages, layout.page_bytes(page_size)), POISON, dtype=torch.uint8)


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16)
    if t.dtype == torch.float32:
        return t.view(torch.int32)
    return t


def _on(x, device: str):
    return x.clone().to(device) if isinstance(x, torch.Tensor) else x


def twin(fn, *args, **kwargs):
    """Run ``fn`` on CPU copies and on CUDA copies; assert every tensor argument and the result match."""
    cpu_args = [_on(a, "cpu") for a in args]
    cpu_kw = {k: _on(v, "cpu") for k, v in kwargs.items()}
    gpu_args = [_on(a, "cuda") for a in args]
    gpu_kw = {k: _on(v, "cuda") for k, v in kwargs.items()}
    want = fn(*cpu_args, **cpu_kw)
    got = fn(*gpu_args, **gpu_kw)
    torch.cuda.synchronize()
    for i, (c, g) in enumerate(zip(cpu_args, gpu_args)):
        if isinstance(c, torch.Tensor):
            bad = _bits(g) != _bits(c)
            assert not bool(bad.any()), f"argument {i} {tuple(c.shape)}: {int(bad.sum())} elements differ"
    for k in cpu_kw:
        if isinstance(cpu_kw[k], torch.Tensor):
            bad = _bits(gpu_kw[k]) != _bits(cpu_kw[k])
            assert not bool(bad.any()), f"{k}: {int(bad.sum())} elements differ"
    if want is not None:
        bad = _bits(got) != _bits(want)
        assert not bool(bad.any()), f"result: {int(bad.sum())} elements differ in rows {bad.any(1).nonzero().squeeze(1)[:8].tolist()}"
    return got


IDX = [torch.int32, torch.int64]


# ---------------------------------------------------------------------------- c1


@pytest.mark.parametrize("eps", [1e-20, 1e-6])
@pytest.mark.parametrize("idx", IDX, ids=["i32", "i64"])
@pytest.mark.parametrize("layout", list(KVLayout))
def test_c1_matches_backend(layout: KVLayout, idx: torch.dtype, eps: float) -> None:
    n, P, pages = 67, 64, 4
    x = _latent_rows(n, 1)
    pos = torch.randint(0, TABLE_ROWS, (n,), generator=_gen(2)).to(idx)
    loc = (torch.randperm(P * pages - 1, generator=_gen(3))[:n] + 1)
    loc[::7] = 0  # padding rows
    loc[3::11] = -1
    out = torch.full((n, 512), -7.0, dtype=BF16)
    twin(fc.c1_decode_norm_rope_store, x, _weight(), pos, loc.to(idx), eps, _freqs(), _cache(layout, P, pages),
         page_size=P, layout=layout, out=out)


@pytest.mark.parametrize("n", [1, 8, 8192])
def test_c1_sizes_page_256(n: int) -> None:
    P = 256
    pages = n // P + 2
    loc = torch.randperm(P * pages - 1, generator=_gen(4))[:n] + 1
    pos = torch.randint(0, TABLE_ROWS, (n,), generator=_gen(5))
    for layout in (L.V4, L.V41_FP4):
        twin(fc.c1_decode_norm_rope_store, _latent_rows(n, 6), _weight(), pos, loc, 1e-20, _freqs(),
             _cache(layout, P, pages), page_size=P, layout=layout)


def test_c1_fp8_cache_view_and_default_out() -> None:
    n, P = 9, 16
    cache = _cache(L.V4, P, 2)
    twin(lambda *a, **k: fc.c1_decode_norm_rope_store(*a[:-1], a[-1].view(torch.float8_e4m3fn), **k),
         _latent_rows(n, 7), _weight(), torch.arange(n), torch.arange(n) + 1, 1e-20, _freqs(), cache, page_size=P)


# ---------------------------------------------------------------------------- c2 decode / verify


@pytest.mark.parametrize("idx", IDX, ids=["i32", "i64"])
@pytest.mark.parametrize("layout", list(KVLayout))
@pytest.mark.parametrize("ring", [2, 8])
def test_c2_decode_matches_backend(ring: int, layout: KVLayout, idx: torch.dtype) -> None:
    n, P, pages = 41, 128, 2
    req = torch.randperm(64, generator=_gen(11))[:n]
    pos = torch.randint(0, TABLE_ROWS, (n,), generator=_gen(12))
    pos[:3] = torch.tensor([0, 1, 2])
    raw = 2 * (torch.randperm(P * pages - 1, generator=_gen(13))[:n] + 1) + (pos & 1)  # distinct slots raw >> 1
    raw[5::9] = 0  # padding rows
    out = torch.full((n, 512), -7.0, dtype=BF16)
    for eps in (1e-20, 1e-6):
        twin(fc.c2_decode_norm_rope_store, _kv_rows(n, 14), _ring(64 * ring + ring + 2, 15), _weight(), pos.to(idx),
             req, raw.to(idx), eps, _freqs(), _cache(layout, P, pages), page_size=P, ring_size=ring, layout=layout,
             out=out)


@pytest.mark.parametrize("layout", [L.V4, L.V41, L.V41_FP4_NEW])
@pytest.mark.parametrize("draft,ring", [(2, 4), (3, 4), (6, 8)])
def test_c2_verify_matches_backend(draft: int, ring: int, layout: KVLayout) -> None:
    reqs, P = 9, 128
    rid = torch.randperm(32, generator=_gen(21))[:reqs]
    p0 = torch.randint(0, TABLE_ROWS - draft, (reqs,), generator=_gen(22))
    pos = (p0[:, None] + torch.arange(draft)).reshape(-1)
    req = rid.repeat_interleave(draft)
    raw = 2 * (torch.randperm(P * 4 - 1, generator=_gen(23))[: reqs * draft] + 1) + (pos & 1)
    raw[-draft:] = 0  # a padded request block
    twin(fc.c2_decode_norm_rope_store, _kv_rows(reqs * draft, 24), _ring(32 * ring + ring + 2, 25), _weight(), pos,
         req, raw, 1e-20, _freqs(), _cache(layout, P, 4), page_size=P, ring_size=ring, draft_len=draft,
         layout=layout)


# ---------------------------------------------------------------------------- c2 prefill


def _prefill_batch(lens: list[int], starts_pos: list[int], seed: int, pad_every: int = 0):
    pos, req, raw = [], [], []
    for b, (n, p0) in enumerate(zip(lens, starts_pos)):
        pos += list(range(p0, p0 + n))
        req += [3 * b + 1] * n
        raw += [1000 * b + 2 + p for p in range(p0, p0 + n)]
    raw = torch.tensor(raw)
    if pad_every:
        raw[pad_every - 1::pad_every] = 0
    start = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)[:-1]), dtype=torch.int32)
    return (torch.tensor(pos), torch.tensor(req), raw, start, torch.tensor(lens, dtype=torch.int32),
            _kv_rows(len(pos), seed))


@pytest.mark.parametrize("idx", IDX, ids=["i32", "i64"])
@pytest.mark.parametrize("layout", list(KVLayout))
@pytest.mark.parametrize("ring", [2, 4])
def test_c2_prefill_matches_backend(ring: int, layout: KVLayout, idx: torch.dtype) -> None:
    P = 128
    pos, req, raw, start, lens, rows = _prefill_batch([5, 1, 0, 17, 2, 30], [2, 9, 0, 0, 31, 100], 31, pad_every=13)
    pages = int(raw.max()) // (2 * P) + 2
    twin(fc.c2_prefill_norm_rope_store, rows, _ring(20 * ring + ring + 2, 32), _weight(), pos.to(idx), req,
         raw.to(idx), 1e-20, _freqs(), _cache(layout, P, pages), start, lens, page_size=P, ring_size=ring,
         layout=layout)


def test_c2_prefill_trailing_padding_and_empty_batch() -> None:
    P, ring = 128, 2
    pos, req, raw, start, lens, rows = _prefill_batch([6, 3], [0, 7], 41)
    rows = torch.cat((rows, _kv_rows(3, 42)))  # three DP padding rows that belong to no request
    pos, req, raw = torch.cat((pos, torch.zeros(3, dtype=pos.dtype))), torch.cat((req, torch.zeros(3, dtype=req.dtype))), \
        torch.cat((raw, torch.zeros(3, dtype=raw.dtype)))
    twin(fc.c2_prefill_norm_rope_store, rows, _ring(16, 43), _weight(), pos, req, raw, 1e-6, _freqs(),
         _cache(L.V4, P, 8), start, lens, page_size=P, ring_size=ring, layout=L.V4)
    empty = torch.zeros(0, dtype=torch.int32)
    twin(fc.c2_prefill_norm_rope_store, rows, _ring(16, 43), _weight(), pos, req, raw, 1e-6, _freqs(),
         _cache(L.V4, P, 8), empty, empty, page_size=P, ring_size=ring, layout=L.V4)


@pytest.mark.parametrize("layout", [L.V4, L.V41_FP4])
@pytest.mark.parametrize("ring", [2, 8])
def test_c2_chunking_invariance_through_kernels(ring: int, layout: KVLayout) -> None:
    """One prefill = two prefill chunks = prefill + decode steps = verify blocks, on CUDA, byte for byte."""
    P, rid, start, length = 16, 1, 7, 24
    rows = _kv_rows(length + 1, 7).cuda()
    w, f = _weight().cuda(), _freqs().cuda()

    def run(steps):
        state = _ring(4 * ring).cuda()
        state[rid * ring + (start - 1) % ring] = rows[0]
        cache = _cache(layout, P, 8).cuda()
        lat = {}
        for kind, lo, hi, d in steps:
            idx = torch.arange(lo, hi, device="cuda")
            x = rows[1 + idx - start].contiguous()
            req, raw = torch.full_like(idx, rid), 2 + idx
            if kind == "prefill":
                out = fc.c2_prefill_norm_rope_store(
                    x, state, w, idx, req, raw, 1e-20, f, cache, torch.tensor([0], dtype=torch.int32, device="cuda"),
                    torch.tensor([hi - lo], dtype=torch.int32, device="cuda"), page_size=P, ring_size=ring,
                    layout=layout)
            else:
                out = fc.c2_decode_norm_rope_store(x, state, w, idx, req, raw, 1e-20, f, cache, page_size=P,
                                                   ring_size=ring, draft_len=d, layout=layout)
            for i, p in enumerate(idx.tolist()):
                if p % 2:
                    lat[p] = out[i].cpu()
        return cache.cpu(), lat

    end = start + length
    ref_cache, ref_lat = run([("prefill", start, end, 0)])
    schedules = [[("prefill", start, k, 0), ("prefill", k, end, 0)] for k in (start + 1, start + 6, end - 1)]
    schedules.append([("prefill", start, start + 3, 0)] + [("decode", p, p + 1, 1) for p in range(start + 3, end)])
    if ring == 8:
        schedules.append([("verify", p, p + 6, 6) for p in range(start, end, 6)])
    for steps in schedules:
        cache, lat = run(steps)
        assert torch.equal(cache, ref_cache), steps
        assert lat.keys() == ref_lat.keys() and all(torch.equal(lat[p], ref_lat[p]) for p in lat), steps


# ---------------------------------------------------------------------------- index-K


@pytest.mark.parametrize("idx", IDX, ids=["i32", "i64"])
@pytest.mark.parametrize("ratio", [1, 2])
@pytest.mark.parametrize("page_size", [64, 128])
def test_index_k_matches_backend(page_size: int, ratio: int, idx: torch.dtype) -> None:
    n, pages = 77, 3
    x = _latent_rows(n, 51, dim=128)
    pos = torch.randint(0, TABLE_ROWS, (n,), generator=_gen(52)).to(idx)
    loc = torch.randperm(page_size * pages - 1, generator=_gen(53))[:n] + 1
    loc[::5] = 0
    loc[2::9] = -1
    for eps in (1e-20, 1e-6):
        cache = torch.full((pages, 68 * page_size), POISON, dtype=torch.uint8)
        twin(fc.index_k_norm_rope_pack_store, x, _weight(54, 128), eps, _freqs(), pos, loc, cache, ratio=ratio)


@pytest.mark.parametrize("n", [1, 15, 17, 8192])
def test_index_k_sizes(n: int) -> None:
    P = 64
    pages = n // P + 2
    loc = torch.randperm(P * pages - 1, generator=_gen(55))[:n] + 1
    cache = torch.full((pages, 68 * P), POISON, dtype=torch.uint8)
    twin(fc.index_k_norm_rope_pack_store, _latent_rows(n, 56, dim=128), _weight(57, 128), 1e-20, _freqs(),
         torch.randint(0, TABLE_ROWS, (n,), generator=_gen(58)), loc, cache, ratio=2)


# ---------------------------------------------------------------------------- CUDA graphs


def test_decode_calls_capture_in_a_cuda_graph() -> None:
    """c1 + index-K + c2 decode captured once, replayed on new inputs: the bytes of eager calls."""
    n, P = 16, 256
    dev = "cuda"
    w, wk, f = _weight().to(dev), _weight(1, 128).to(dev), _freqs().to(dev)
    x1 = _latent_rows(n, 61).to(dev)
    xk = _latent_rows(n, 62, dim=128).to(dev)
    x2 = _kv_rows(n, 63).to(dev)
    pos = torch.arange(n, device=dev) + 101
    loc = torch.arange(n, device=dev) + 1
    req = torch.arange(n, device=dev)
    cache1, cachek = _cache(L.V4, P, 2).to(dev), torch.zeros(2, 68 * 64, dtype=torch.uint8, device=dev)
    cache2, state = _cache(L.V4, P // 2, 4).to(dev), _ring(2 * n + 4, 64).to(dev)
    out1 = torch.empty(n, 512, dtype=BF16, device=dev)
    out2 = torch.zeros(n, 512, dtype=BF16, device=dev)

    def step():
        fc.c1_decode_norm_rope_store(x1, w, pos, loc, 1e-20, f, cache1, page_size=P, out=out1)
        fc.index_k_norm_rope_pack_store(xk, wk, 1e-20, f, pos, loc, cachek, ratio=1)
        fc.c2_decode_norm_rope_store(x2, state, w, pos, req, 2 * loc, 1e-20, f, cache2, page_size=P // 2,
                                     ring_size=2, out=out2)

    step()  # loads the modules outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    x1.copy_(_latent_rows(n, 71).to(dev))
    xk.copy_(_latent_rows(n, 72, dim=128).to(dev))
    x2.copy_(_kv_rows(n, 73).to(dev))
    pos.add_(1)
    snapshot = [t.clone() for t in (cache1, cachek, cache2, state, out1, out2)]
    graph.replay()
    torch.cuda.synchronize()
    replayed = [t.clone() for t in (cache1, cachek, cache2, state, out1, out2)]
    for t, s in zip((cache1, cachek, cache2, state, out1, out2), snapshot):
        t.copy_(s)
    step()
    torch.cuda.synchronize()
    for i, (t, r) in enumerate(zip((cache1, cachek, cache2, state, out1, out2), replayed)):
        assert torch.equal(_bits(t), _bits(r)), f"tensor {i} differs between replay and eager"
