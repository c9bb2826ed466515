"""Behaviour of the V4.1 reference ops (spec v41.md §13 items 3-8): sentinels, ring, chunking invariance."""

from __future__ import annotations

import pytest
import torch

import flashcompress as fc
from flashcompress.torch_backend.quant import bf16_round
from flashcompress.v41.layouts import KVLayout, index_k_addressing

L = KVLayout
BF16 = torch.bfloat16
TABLE_ROWS = 64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _freqs() -> torch.Tensor:
    theta = torch.arange(TABLE_ROWS).double()[:, None] * 10000.0 ** (-torch.arange(32).double() / 32)
    f = torch.empty(TABLE_ROWS, 64)
    f[:, 0::2], f[:, 1::2] = torch.cos(theta).float(), torch.sin(theta).float()
    return f


def _latent_rows(n: int, seed: int) -> torch.Tensor:
    """bf16 rows spanning six decades of magnitude."""
    g = _gen(seed)
    mag = 10.0 ** torch.randint(-3, 3, (n, 1), generator=g).float()
    return (torch.randn(n, 512, generator=g) * mag).to(BF16)


def _weight(seed: int = 0, dim: int = 512) -> torch.Tensor:
    return (1 + 0.25 * torch.randn(dim, generator=_gen(seed))).to(BF16)


def _cache(layout: KVLayout, page_size: int, pages: int = 2) -> torch.Tensor:
    return torch.full((pages, layout.page_bytes(page_size)), 0xA5, dtype=torch.uint8)


def _ring(rows: int) -> torch.Tensor:
    state = torch.zeros(rows, 1024)
    state[:, 512:] = float("-inf")
    return state


def _slot(cache: torch.Tensor, layout: KVLayout, page_size: int, slot: int) -> torch.Tensor:
    a = layout.row_addressing(page_size)
    flat = cache.view(-1)
    base, s = (slot // page_size) * a.page_bytes, slot % page_size
    d0, s0 = base + s * a.data_stride, base + a.scale_base + s * a.scale_stride
    return torch.cat((flat[d0: d0 + a.data_bytes], flat[s0: s0 + a.scale_bytes]))


# ---------------------------------------------------------------------------
# c1
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("layout", list(KVLayout))
def test_c1_sentinels_dtypes_and_batch_independence(layout: KVLayout) -> None:
    n, P = 12, 16
    x = _latent_rows(n, 1)
    pos = torch.tensor([0, 1, 5, TABLE_ROWS - 1, 7, 8, 9, 10, 11, 12, 13, 2])
    loc = torch.tensor([3, 0, 17, 31, -1, 4, 0, 16, 1, -7, 30, 15])
    cache = _cache(layout, P)
    out = fc.c1_decode_norm_rope_store(x, _weight(), pos, loc, 1e-20, _freqs(), cache, page_size=P, layout=layout)
    # every row's latent is published, padded and negative-slot rows included; nothing else reaches slot 0
    assert (out != 0).any(1).all()
    untouched = _cache(layout, P)
    for s in loc[loc > 0].tolist():
        untouched_slot = _slot(untouched, layout, P, s)
        assert not torch.equal(_slot(cache, layout, P, s)[: layout.data_bytes], untouched_slot[: layout.data_bytes])
    stored = {s: _slot(cache, layout, P, s).clone() for s in loc[loc > 0].tolist()}
    for s in stored:  # erase the stored slots: the rest of the cache must be the poison
        a = layout.row_addressing(P)
        base, j = (s // P) * a.page_bytes, s % P
        cache.view(-1)[base + j * a.data_stride: base + j * a.data_stride + a.data_bytes] = 0xA5
        cache.view(-1)[base + a.scale_base + j * a.scale_stride: base + a.scale_base + j * a.scale_stride + a.scale_bytes] = 0xA5
    assert torch.equal(cache, untouched)
    # int32 metadata, and each row alone, give the same bytes
    for i in (0, 3, 7):
        alone = _cache(layout, P)
        lat = fc.c1_decode_norm_rope_store(x[i: i + 1], _weight(), pos[i: i + 1].int(), loc[i: i + 1].int(), 1e-20,
                                           _freqs(), alone, page_size=P, layout=layout)
        assert torch.equal(lat, out[i: i + 1])
        assert torch.equal(_slot(alone, layout, P, int(loc[i])), stored[int(loc[i])])


def test_c1_eps_matters_only_for_tiny_rows() -> None:
    x = (torch.randn(2, 512, generator=_gen(3)) * torch.tensor([[1.0], [1e-10]])).to(BF16)
    args = (_weight(), torch.tensor([4, 5]), torch.tensor([1, 2]))
    a = fc.c1_decode_norm_rope_store(x, *args, 1e-20, _freqs(), _cache(L.V4, 4), page_size=4)
    b = fc.c1_decode_norm_rope_store(x, *args, 1e-6, _freqs(), _cache(L.V4, 4), page_size=4)
    assert torch.equal(a[0], b[0]) and not torch.equal(a[1], b[1])
    assert (a[1].float().abs().max() > 0.5) and (b[1].float().abs().max() < 1e-3)


def test_fp4_cache_reads_back_as_the_fake_quantised_rope_dims() -> None:
    """V41_FP4 (codes x e4m3 scales) decodes to the values the V4 layout keeps as bf16 (dims 448-511)."""
    n, P = 32, 32
    x = _latent_rows(n, 4)
    pos, loc = torch.arange(n) + 1, torch.arange(n) + 1
    caches = {lay: _cache(lay, P) for lay in (L.V4, L.V41_FP4)}
    for lay, c in caches.items():
        fc.c1_decode_norm_rope_store(x, _weight(), pos, loc, 1e-20, _freqs(), c, page_size=P, layout=lay)
    from flashcompress.torch_backend.v41_quant import e2m1_values, e4m3_values
    for s in range(1, n + 1):
        fp4 = _slot(caches[L.V41_FP4], L.V41_FP4, P, s)
        codes = torch.stack((fp4[:256] & 15, fp4[:256] >> 4), 1).reshape(-1)
        values = e2m1_values(codes) * e4m3_values(fp4[256:].clone()).repeat_interleave(16)
        v4_rope = _slot(caches[L.V4], L.V4, P, s)[448:576].clone().view(BF16).float()
        assert torch.equal(values[448:], v4_rope)


# ---------------------------------------------------------------------------
# c2 decode / verify / prefill
# ---------------------------------------------------------------------------


def _kv_rows(n: int, seed: int) -> torch.Tensor:
    g = _gen(seed)
    kv = torch.randn(n, 512, generator=g) * 10.0 ** torch.randint(-2, 2, (n, 1), generator=g).float()
    return torch.cat((kv, torch.randn(n, 512, generator=g) * 3), 1)


def _c2_decode(rows, state, pos, req, raw, cache, *, ring, draft=1, layout=L.V4, P=16):
    return fc.c2_decode_norm_rope_store(rows, state, _weight(), torch.tensor(pos), torch.tensor(req),
                                        torch.tensor(raw), 1e-20, _freqs(), cache, page_size=P, ring_size=ring,
                                        draft_len=draft, layout=layout)


@pytest.mark.parametrize("ring", [2, 8])
def test_c2_decode_park_pool_pad(ring: int) -> None:
    rows = _kv_rows(4, 5)
    state = _ring(4 * ring)
    state[1 * ring + (6 % ring)] = _kv_rows(1, 6)[0]  # partner of request 1's position 7
    before = state.clone()
    cache = _cache(L.V4, 16)
    # request 0 parks position 4, request 1 pools 7, row 2 is padding, request 3 pools 1 with a cleared partner
    out = _c2_decode(rows, state, [4, 7, 3, 1], [0, 1, 2, 3], [8, 15, 0, 3], cache, ring=ring)
    assert torch.equal(state[0 * ring + 4 % ring], rows[0])
    changed = (state != before).any(1).nonzero().squeeze(1).tolist()
    assert changed == [4 % ring]
    assert (out[[0, 2]] == 0).all() and (out[[1, 3]] != 0).any(1).all()
    # a cleared partner pools to the odd token alone: same bytes as c1 on bf16(kv) at position pos - 1
    alone = _cache(L.V4, 16)
    lat = fc.c1_decode_norm_rope_store(bf16_round(rows[3:4, :512]).to(BF16), _weight(), torch.tensor([0]),
                                       torch.tensor([1]), 1e-20, _freqs(), alone, page_size=16)
    assert torch.equal(lat[0], out[3]) and torch.equal(_slot(alone, L.V4, 16, 1), _slot(cache, L.V4, 16, 1))
    # the padded row (raw 0) and slot 0 stay untouched
    assert torch.equal(_slot(cache, L.V4, 16, 0), _slot(_cache(L.V4, 16), L.V4, 16, 0))


def _schedule_run(steps, start: int, length: int, ring: int, layout: KVLayout):
    """Feed one request (rid 1) through ``steps``; returns (cache, {odd position: latent}, ring rows by position)."""
    P, rid, base = 16, 1, 2  # raw_out_loc = base + pos: raw = pos (mod 2), never 0
    rows = _kv_rows(length + 1, 7)  # row 0 = the partner parked before ``start`` when start is odd
    state = _ring(4 * ring)
    if start % 2:
        state[rid * ring + (start - 1) % ring] = rows[0]
    cache = _cache(layout, P, pages=4)
    latents = {}
    for kind, lo, hi, d in steps:
        idx = torch.arange(lo, hi)
        x = rows[1 + idx - start]
        pos, req, raw = idx, torch.full_like(idx, rid), base + idx
        if kind == "prefill":
            out = fc.c2_prefill_norm_rope_store(x, state, _weight(), pos, req, raw, 1e-20, _freqs(), cache,
                                                torch.tensor([0], dtype=torch.int32),
                                                torch.tensor([hi - lo], dtype=torch.int32),
                                                page_size=P, ring_size=ring, layout=layout)
        else:
            out = fc.c2_decode_norm_rope_store(x, state, _weight(), pos, req, raw, 1e-20, _freqs(), cache,
                                               page_size=P, ring_size=ring, draft_len=d, layout=layout)
        for i, p in enumerate(pos.tolist()):
            if p % 2:
                latents[p] = out[i]
            else:
                assert (out[i] == 0).all()
    return cache, latents


def _schedules(start: int, length: int, ring: int):
    end = start + length
    yield [("prefill", start, end, 0)]
    for k in range(start + 1, end):
        yield [("prefill", start, k, 0), ("prefill", k, end, 0)]
    yield [("prefill", start, start + 3, 0)] + [("decode", p, p + 1, 1) for p in range(start + 3, end)]
    yield [("decode", p, p + 1, 1) for p in range(start, end)]
    for d in (3, 5, 7):
        if d < ring:
            head = length % d
            steps = [("prefill", start, start + head, 0)] if head else []
            yield steps + [("verify", p, p + d, d) for p in range(start + head, end, d)]


@pytest.mark.parametrize("layout", [L.V4, L.V41_FP4])
@pytest.mark.parametrize("ring", [2, 8])
@pytest.mark.parametrize("start", [0, 7])
def test_c2_chunking_invariance(start: int, ring: int, layout: KVLayout) -> None:
    """One prefill = every two-chunk split = prefill + decodes = decodes = verify blocks, byte for byte."""
    length = 12
    ref_cache, ref_lat = _schedule_run([("prefill", start, start + length, 0)], start, length, ring, layout)
    assert len(ref_lat) == length // 2
    runs = 0
    for steps in _schedules(start, length, ring):
        cache, lat = _schedule_run(steps, start, length, ring, layout)
        assert torch.equal(cache, ref_cache), steps
        assert lat.keys() == ref_lat.keys() and all(torch.equal(lat[p], ref_lat[p]) for p in lat), steps
        runs += 1
    assert runs == length + 2 + (3 if ring == 8 else 0)


def test_c2_prefill_mixed_batch_and_write_back() -> None:
    ring, P = 4, 16
    # requests: A rid 0 pos 2..6 (even start, ends even), B rid 1 pos 9..9 (length 1, odd: ring partner),
    # C rid 2 zero-length, D rid 3 pos 0..2 with a padded row in the middle; two trailing padded rows
    pos = [2, 3, 4, 5, 6, 9, 0, 1, 2, 0, 0]
    req = [0, 0, 0, 0, 0, 1, 3, 3, 3, 0, 0]
    raw = [20, 21, 22, 23, 24, 41, 60, 0, 62, 0, 0]
    rows = _kv_rows(len(pos), 8)
    state = _ring(4 * ring + 2)
    state[1 * ring + 8 % ring] = _kv_rows(1, 9)[0]
    start = torch.tensor([0, 5, 6, 6], dtype=torch.int32)
    lens = torch.tensor([5, 1, 0, 3], dtype=torch.int32)
    cache = _cache(L.V41, P, pages=4)
    before = state.clone()
    out = fc.c2_prefill_norm_rope_store(rows, state, _weight(), torch.tensor(pos), torch.tensor(req), torch.tensor(raw),
                                        1e-20, _freqs(), cache, start, lens, page_size=P, ring_size=ring,
                                        layout="v41")
    # latents only for odd, non-padded rows
    assert (out != 0).any(1).tolist() == [False, True, False, True, False, True, False, False, False, False, False]
    # write-back: the last min(len, ring) non-padded rows per request, at req * ring + pos % ring
    want = before.clone()
    for row in (1, 2, 3, 4, 5, 6, 8):
        want[req[row] * ring + pos[row] % ring] = rows[row]
    assert torch.equal(state, want)
    # position 9 of B pooled with the ring; same bytes as a decode step on the same ring
    state2 = before.clone()
    cache2 = _cache(L.V41, P, pages=4)
    lat = _c2_decode(rows[5:6], state2, [9], [1], [41], cache2, ring=ring, layout=L.V41, P=P)
    assert torch.equal(lat[0], out[5]) and torch.equal(_slot(cache2, L.V41, P, 20), _slot(cache, L.V41, P, 20))


# ---------------------------------------------------------------------------
# index-K
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("page_size", [64, 128])
def test_index_k_ratio_masking_sentinels_and_pages(page_size: int) -> None:
    n = 6
    x = (torch.randn(n, 128, generator=_gen(10)) * 3).to(BF16)
    w = _weight(1, 128)
    pos = torch.tensor([5, 6, 9, 3, 11, 13])
    loc = torch.tensor([130, 0, 7, -1, 200, 1])
    c2 = torch.full((4, 68 * page_size), 0xA5, dtype=torch.uint8)
    fc.index_k_norm_rope_pack_store(x, w, 1e-20, _freqs(), pos, loc, c2, ratio=2)
    c1 = torch.full_like(c2, 0xA5)
    fc.index_k_norm_rope_pack_store(x, w, 1e-20, _freqs(), pos & ~1, loc, c1, ratio=1)
    assert torch.equal(c1, c2)  # ratio 2 rotates at the pair's first position
    a = index_k_addressing(page_size)
    flat = c2.view(-1).clone()
    for s in (130, 7, 200, 1):
        base, j = (s // page_size) * a.page_bytes, s % page_size
        payload = flat[base + 64 * j: base + 64 * j + 64]
        scales = flat[base + a.scale_base + 4 * j: base + a.scale_base + 4 * j + 4]
        assert not (payload == 0xA5).all() and (scales >= 100).all() and (scales <= 140).all()
        flat[base + 64 * j: base + 64 * j + 64] = 0xA5
        flat[base + a.scale_base + 4 * j: base + a.scale_base + 4 * j + 4] = 0xA5
    assert (flat == 0xA5).all()  # loc 0 / -1 rows and every other byte untouched


def test_fp8_cache_view_and_caller_out() -> None:
    """The pool's float8_e4m3fn view of the cache gets the same bytes; a caller's ``out`` is filled in place."""
    x = _latent_rows(3, 11)
    pos, loc = torch.tensor([1, 2, 3]), torch.tensor([4, 0, 6])
    ref = _cache(L.V41, 8)
    want = fc.c1_decode_norm_rope_store(x, _weight(), pos, loc, 1e-20, _freqs(), ref, page_size=8, layout=L.V41)
    view = _cache(L.V41, 8).view(torch.float8_e4m3fn)
    out = torch.full((3, 512), 7.0, dtype=BF16)
    got = fc.c1_decode_norm_rope_store(x, _weight(), pos, loc, 1e-20, _freqs(), view, page_size=8, layout="V41",
                                       out=out)
    assert got is out and torch.equal(out, want) and torch.equal(view.view(torch.uint8), ref)
