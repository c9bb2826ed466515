"""V4.1 cache layouts (spec v41.md §7.1-§7.2) and the fp4 / fp8 encoders on crafted values (§13 items 1-2)."""

from __future__ import annotations

import pytest
import torch

import flashcompress as fc
from flashcompress.torch_backend import v41_quant as Q
from flashcompress.torch_backend.quant import e4m3_codes, ue8m0_ceil
from flashcompress.v41.layouts import KVLayout, index_k_addressing, pair_ring_rows, pair_ring_size

L = KVLayout
# spec §7.2: page bytes per P, and (bytes/token, C++ value)
PAGE_BYTES = {
    256: {L.V4: 149760, L.V41: 135168, L.V41_NEW: 135168, L.V41_FP4: 73728, L.V41_FP4_NEW: 73728, L.UNIFORM_FP8: 131072},
    128: {L.V4: 74880, L.V41: 67584, L.V41_NEW: 67584, L.V41_FP4: 36864, L.V41_FP4_NEW: 36864, L.UNIFORM_FP8: 65536},
    64: {L.V4: 37440, L.V41: 33792, L.V41_NEW: 33792, L.V41_FP4: 18432, L.V41_FP4_NEW: 18432, L.UNIFORM_FP8: 32768},
    2: {L.V4: 1728, L.V41: 1536, L.V41_NEW: 1056, L.V41_FP4: 768, L.V41_FP4_NEW: 576, L.UNIFORM_FP8: 1024},
    1: {L.V4: 1152, L.V41: 1024, L.V41_NEW: 528, L.V41_FP4: 512, L.V41_FP4_NEW: 288, L.UNIFORM_FP8: 512},
}
SCALE_REGION = {256: (147456, 131072, 65536), 128: (73728, 65536, 32768), 64: (36864, 32768, 16384), 2: (1152, 1024, 512)}
TRAITS = {L.V4: (584, 0), L.V41: (528, 1), L.V41_FP4: (288, 2), L.UNIFORM_FP8: (512, 3), L.V41_NEW: (528, 4),
          L.V41_FP4_NEW: (288, 5)}


@pytest.mark.parametrize("page_size", sorted(PAGE_BYTES))
@pytest.mark.parametrize("layout", list(KVLayout))
def test_page_bytes_and_addressing(layout: KVLayout, page_size: int) -> None:
    assert layout.page_bytes(page_size) == PAGE_BYTES[page_size][layout]
    assert (layout.bytes_per_token, layout.cpp_value) == TRAITS[layout]
    a = layout.row_addressing(page_size)
    last = page_size - 1
    # every slot's bytes fit its page and no two slots share a byte
    spans = []
    for s in range(page_size):
        spans.append((s * a.data_stride, s * a.data_stride + a.data_bytes))
        if a.scale_bytes:
            spans.append((a.scale_base + s * a.scale_stride, a.scale_base + s * a.scale_stride + a.scale_bytes))
    spans.sort()
    assert all(e0 <= s1 for (_, e0), (s1, _) in zip(spans, spans[1:]))
    assert spans[-1][1] <= a.page_bytes
    if layout.is_interleaved:
        assert a.data_stride == a.scale_stride == layout.bytes_per_token and a.scale_base == layout.data_bytes
    elif page_size in SCALE_REGION and layout in (L.V4, L.V41, L.V41_FP4):
        assert a.scale_base == SCALE_REGION[page_size][(L.V4, L.V41, L.V41_FP4).index(layout)]
    assert last * a.data_stride + a.data_bytes <= a.page_bytes


def test_layout_parse_and_flags() -> None:
    assert KVLayout.parse("V41_FP4") is L.V41_FP4 and KVLayout.parse("v4") is L.V4 and KVLayout.parse(L.V41) is L.V41
    assert [m.is_fp4 for m in L] == [False, False, True, False, False, True]
    assert {m.encoding for m in L} == {"v4", "v41_fp8", "v41_fp4", "uniform_fp8"}
    with pytest.raises(ValueError, match="layout: expected one of"):
        KVLayout.parse("fp4")
    with pytest.raises(TypeError, match="layout"):
        KVLayout.parse(2)
    assert fc.KVLayout is KVLayout


def test_index_k_and_ring_sizes() -> None:
    a = index_k_addressing(64)
    assert (a.page_bytes, a.scale_base, a.data_stride, a.scale_stride) == (4352, 4096, 64, 4)
    assert index_k_addressing(128).page_bytes == 8704
    assert [pair_ring_size(n) for n in (0, 1, 2, 3, 6, 7, 14)] == [2, 4, 4, 8, 8, 16, 16]
    assert pair_ring_rows(3, 2) == 10 and pair_ring_rows(4, 8) == 42


def _rows(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mag = 10.0 ** torch.randint(-3, 3, (n, 1), generator=g).float()
    return (torch.randn(n, 512, generator=g) * mag).to(torch.bfloat16)


def test_interleaved_pages_are_the_block_split_slots_side_by_side() -> None:
    """V41_FP4_NEW page = per slot (data ‖ scales) of the V41_FP4 page; same for V41_NEW / V41."""
    n, P = 8, 8
    x = _rows(n, 1)
    freqs = torch.randn(16, 64)
    pos, loc = torch.arange(n) + 3, torch.arange(n) + 1
    for split, inter in ((L.V41_FP4, L.V41_FP4_NEW), (L.V41, L.V41_NEW)):
        caches = {}
        for lay in (split, inter):
            caches[lay] = torch.zeros(2, lay.page_bytes(P), dtype=torch.uint8)
            fc.c1_decode_norm_rope_store(x, torch.ones(512, dtype=torch.bfloat16), pos, loc, 1e-6, freqs,
                                         caches[lay], page_size=P, layout=lay)
        page = caches[split].reshape(2, -1)
        db, sb = split.data_bytes, split.scale_bytes
        data = page[:, : P * db].reshape(2, P, db)
        scales = page[:, P * db: P * (db + sb)].reshape(2, P, sb)
        assert torch.equal(torch.cat((data, scales), 2).reshape(2, -1), caches[inter])


# ---------------------------------------------------------------------------
# encoders
# ---------------------------------------------------------------------------

def _nearest_even_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Brute force: nearest grid value, ties to the even code, saturate, sign bit of x."""
    grid = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float64)
    a = x.abs().double().clamp(max=6).unsqueeze(-1)
    dist = (a - grid).abs()
    best = dist.min(-1, keepdim=True).values
    candidates = (dist == best) * torch.arange(8)  # index = magnitude code
    odd_penalty = torch.where(dist == best, (torch.arange(8) % 2) * 16, 99)
    code = (candidates + odd_penalty).argmin(-1)  # an even code wins a tie
    return code.to(torch.uint8) | (torch.signbit(x).to(torch.uint8) << 3)


def test_e2m1_ties_saturation_and_signs() -> None:
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert Q.e2m1_rne_codes(ties).tolist() == [0, 2, 2, 4, 4, 6, 6]
    assert Q.e2m1_rne_codes(-ties).tolist() == [8, 10, 10, 12, 12, 14, 14]
    special = torch.tensor([6.0, 6.5, 1e30, float("inf"), -7.0, 0.0, -0.0, -0.1, float("nan")])
    assert Q.e2m1_rne_codes(special).tolist() == [7, 7, 7, 7, 15, 0, 8, 8, 7]
    x = torch.randn(20000) * 3
    assert torch.equal(Q.e2m1_rne_codes(x), _nearest_even_e2m1(x))
    assert torch.equal(Q.e2m1_values(Q.e2m1_rne_codes(x)), _nearest_even_e2m1(x).to(torch.float32).apply_(
        lambda c: [0, 0.5, 1, 1.5, 2, 3, 4, 6][int(c) & 7] * (-1 if int(c) & 8 else 1)))


def test_fake_quant_zero_tile_and_small_negatives() -> None:
    u = torch.zeros(1, 512)
    u[0, 16:32] = torch.tensor([-1e-6] * 15 + [1.0])  # small negatives next to a large value
    q = Q.fake_quant_kv(u)
    assert torch.equal(q[0, :16], torch.zeros(16)) and not torch.signbit(q[0, :16]).any()  # +0 for zeros
    assert torch.signbit(q[0, 16:31]).all() and (q[0, 16:31] == 0).all()  # -0 for the small negatives
    codes, scale = Q._kv_scales(u, divide=True)
    assert scale[0, 0] == 2.0**-9 and codes[0, 0] == 1  # amax 0: the 2^-9 floor (e4m3 code 1)
    data, scales = Q.encode(q, u, L.V41_FP4)
    assert data[0, 8:15].tolist() == [0x88] * 7  # V41_FP4 keeps the sign of a small negative


def test_scale_division_vs_multiplication_tie() -> None:
    """fake quant uses amax * fp32(1/6), the V41_FP4 encoder amax / 6: some amax straddle an e4m3 tie."""
    codes = torch.arange(8, 120, dtype=torch.uint8)
    mids = (Q.e4m3_values(codes) + Q.e4m3_values(codes + 1)) / 2
    around = (mids * 6).view(torch.int32).unsqueeze(1) + torch.arange(-3, 4, dtype=torch.int32)
    amax = around.view(torch.float32).reshape(-1)
    by_div = e4m3_codes(amax / torch.full_like(amax, 6.0), clip=False)
    by_mul = e4m3_codes(amax * Q.INV_FP4_MAX, clip=False)
    differ = by_div != by_mul
    assert bool(differ.any())
    a = amax[differ][0]
    u = torch.zeros(1, 512)
    u[0, 0] = a
    _, fp4_scales = Q.encode(u, u, L.V41_FP4)
    assert fp4_scales[0, 0] == by_div[differ][0] != by_mul[differ][0]
    assert Q._kv_scales(u, divide=False)[0][0, 0] == by_mul[differ][0]


def test_v41_exponent_formula() -> None:
    g = torch.Generator().manual_seed(3)
    amax = torch.cat((torch.rand(5000, generator=g) * 10.0 ** torch.randint(-8, 4, (5000,), generator=g),
                      2.0 ** torch.arange(-20, 9).float(), torch.tensor([0.0, 1e-4 * 448, 448.0 * 1.75])))
    tiles = torch.zeros(amax.shape[0], 512)
    tiles[:, 0] = amax
    _, e = Q._encode_v41_fp8(tiles)
    want = ue8m0_ceil((amax / torch.full_like(amax, 448.0)).clamp_min(1e-4))
    assert torch.equal(e[:, 0].int(), want)
    assert (e[:, 1:] == 114).all()


def test_v4_tile_below_amax_floor() -> None:
    q = torch.zeros(1, 512)
    q[0, :64] = 3e-5
    data, scales = Q.encode(q, q, L.V4)
    assert scales.shape == (1, 7)  # pad byte never written
    assert int(scales[0, 0]) == int(ue8m0_ceil(torch.tensor([1e-4]) / 448.0)) and int(scales[0, 1]) == int(scales[0, 0])


def test_index_k_two_stage_quantiser() -> None:
    k = torch.zeros(1, 128)
    k[0, 0] = 6.0  # amax/6 on a power of two: e2 = 127 exactly, code 7
    k[0, 1:8] = -1e-9  # negative zeros are stored as code 0
    payload, e2 = Q.index_k_codes(k)
    assert e2[0].tolist() == [127, 114, 114, 114]  # empty blocks: the 1e-4 floor (2^-13, ue8m0 114)
    assert payload[0, 0] == 0x07 and (payload[0, 1:] == 0).all()
    # the two stages are not one: a one-stage quantiser (stage 2 on k directly) differs on random rows
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2000, 128, generator=g).to(torch.bfloat16).float()
    two, _ = Q.index_k_codes(x)
    blocks = x.reshape(-1, 4, 32)
    e = ue8m0_ceil((Q.store._amax(blocks) / torch.full((1,), 6.0)).clamp_min(1e-4)).clamp(1, 254)
    one = Q.pack_nibbles(Q.e2m1_rne_codes(blocks * ((254 - e) << 23).view(torch.float32).unsqueeze(-1)).reshape(-1, 128))
    assert bool((one != two).any())
