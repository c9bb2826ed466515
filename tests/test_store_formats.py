"""Cache formats and scalar quantisers of the store step.

* The worked examples of spec/store-and-jit.md §12 (V4 main KV, indexer FP8 and
  FP4), built from their formulas and checked by bytes, SHA-256 and placement.
* Unit tests of the exact conversions in ``torch_backend.quant`` (§4.3).
* Page sizes of the formats (§5.1, §6.4).
"""

from __future__ import annotations

import hashlib
import math

import pytest
import torch

from flashcompress import layouts
from flashcompress.torch_backend import quant
from flashcompress.torch_backend.store import apply_rope, hadamard128, norm_factor, norm_rope_store, rms_norm

POISON = 0x5A
F32 = torch.float32


def f32_bits(v: float) -> int:
    return int(torch.tensor(v, dtype=F32).view(torch.int32)) & 0xFFFFFFFF


def f32_from_bits(b: int) -> float:
    return float(torch.tensor(b, dtype=torch.int64).to(torch.int32).view(F32))


# --------------------------------------------------------------------------
# §12 worked examples
# --------------------------------------------------------------------------


def example_freq_real(rows: int = 8) -> torch.Tensor:
    """Table whose row 4 is the synthetic §12 row: theta_q = 4 * 40000^(-q/32), cos/sin in float64 -> fp32."""
    q = torch.arange(32, dtype=torch.float64)
    theta = 4.0 * torch.pow(torch.tensor(40000.0, dtype=torch.float64), -q / 32)
    table = torch.zeros(rows, 64, dtype=F32)
    table[4, 0::2] = torch.cos(theta).to(F32)
    table[4, 1::2] = torch.sin(theta).to(F32)
    return table


def example_main_input() -> tuple[torch.Tensor, torch.Tensor]:
    i = torch.arange(512)
    t = i // 64
    x = torch.pow(2.0, (t - 3).to(torch.float64)) * ((((37 * i + 11 * t) % 64).to(torch.float64) - 31.5) / 32)
    w = 1 + (i % 4).to(torch.float64) / 4
    return x.to(F32).unsqueeze(0), w.to(F32)


def example_indexer_input() -> tuple[torch.Tensor, torch.Tensor]:
    i = torch.arange(128)
    x = (((53 * i + 7) % 128).to(torch.float64) - 63.5) / 64
    w = 1 + ((i % 8).to(torch.float64) - 4) / 16
    return x.to(F32).unsqueeze(0), w.to(F32)


def store_one(x, w, fmt, page_size, out_loc, num_pages=3) -> torch.Tensor:
    """Store one row (seq_len 8, ratio 4 -> position 4) at ``out_loc`` into a poisoned cache."""
    cache = torch.full((num_pages, fmt.page_bytes(page_size)), POISON, dtype=torch.uint8)
    norm_rope_store(
        x,
        torch.tensor([8 - 4]),
        torch.tensor([out_loc]),
        torch.tensor([True]),
        norm_weight=w,
        norm_eps=1e-6,
        freq_real=example_freq_real(),
        kvcache=cache,
        page_size=page_size,
        fmt=fmt,
    )
    return cache


def take(cache: torch.Tensor, start: int, n: int) -> bytes:
    return bytes(cache.reshape(-1)[start : start + n].tolist())


def assert_only_written(cache: torch.Tensor, ranges: list[tuple[int, int]]) -> None:
    """Every byte outside the given (start, length) ranges still holds the poison byte."""
    rest = cache.reshape(-1).clone()
    for start, n in ranges:
        rest[start : start + n] = POISON
    bad = (rest != POISON).nonzero().flatten()
    assert bad.numel() == 0, f"byte {int(bad[0])} outside the entry was written"


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_example_table_row() -> None:
    f = example_freq_real()[4]
    assert [f32_bits(float(v)) for v in f[:6]] == [
        0xBF275530, 0xBF41BDCF, 0xBF76C7DD, 0x3E882A71, 0xBEF1CF46, 0x3F61A675,
    ]  # fmt: skip


def test_example_main_intermediates() -> None:
    x, w = example_main_input()
    assert float(x[0, 0]) == -0.123046875 and float(x[0, 1]) == 0.021484375
    assert f32_bits(float(norm_factor(x, 1e-6))) == 0x3E87C838
    y = rms_norm(x, w, 1e-6)
    assert float(y[0, 0]) == pytest.approx(-0.03263196, rel=1e-6)
    assert int(quant.bf16_bits(y[0, :1])) & 0xFFFF == 0xBD06
    r = apply_rope(y, example_freq_real()[4:5])
    assert float(y[0, 448]) == pytest.approx(-2.4530947, rel=1e-6)
    assert float(y[0, 449]) == pytest.approx(3.0663683, rel=1e-6)
    assert float(r[0, 448]) == pytest.approx(3.9240851, rel=1e-6)
    assert float(r[0, 449]) == pytest.approx(-0.14780378, rel=1e-6)
    assert torch.equal(r[:, :448], y[:, :448])


def test_example_v4_main_kv() -> None:
    """§12.1: V4 entry at out_loc 130 in a P = 64 c4 cache (page 2, slot 2)."""
    fmt, page_size = layouts.MAIN_V4, 64
    x, w = example_main_input()
    cache = store_one(x, w, fmt, page_size, out_loc=130)
    assert fmt.page_bytes(page_size) == 37440
    data_at, scale_at = 2 * 37440 + 2 * 576, 2 * 37440 + 64 * 576 + 2 * 8
    assert (data_at, scale_at) == (76032, 111760)
    data, scales = take(cache, data_at, 576), take(cache, scale_at, 8)

    assert scales[:7].hex() == "73747576777879"
    assert scales[7] == POISON  # the pad byte is never written
    tiles = ["f05ff16e", "eb6be874", "e27145f4", "4df069ee", "65ea71e0", "6cd9f464", "f062f070"]
    assert [data[64 * k : 64 * k + 4].hex() for k in range(7)] == tiles
    assert data[448:452].hex() == "7b4017be"
    assert data[452:456].hex() == "04bedac0"
    assert data[568:576].hex() == "58407ebeb5c0fc3f"
    assert sha(data) == "434648ef8049a00aff47250e75d0c8c5a355b81aacc73f472c2d4da622e28a03"
    # the spec's record hash assumes a zero-initialised pool (pad byte 0)
    assert sha(data + scales[:7] + b"\0") == "7e53b48526e9578f65e8916f5416eedefcafb0e363fa4159a65290920472d1c9"
    assert_only_written(cache, [(data_at, 576), (scale_at, 7)])


def test_example_bf16_store_matches_v4_rope() -> None:
    """§5.6: bf16 rows addressed by out_loc; dims 448.. equal the V4 rope bytes."""
    x, w = example_main_input()
    cache = store_one(x, w, layouts.BF16_ROWS, 1, out_loc=3, num_pages=5)
    assert cache.shape == (5, 1024)
    assert_only_written(cache, [(3 * 1024, 1024)])
    row = cache[3]
    y = rms_norm(x, w, 1e-6)
    nope = quant.bf16_bits(y[0, :448]).view(torch.uint8)
    assert torch.equal(row[:896], nope)
    v4 = store_one(x, w, layouts.MAIN_V4, 64, out_loc=130)
    assert take(v4, 76032 + 448, 128) == bytes(row[896:].tolist())


def test_example_indexer_intermediates() -> None:
    x, w = example_indexer_input()
    assert f32_bits(float(norm_factor(x, 1e-6))) == 0x3FDDB57D
    r = apply_rope(rms_norm(x, w, 1e-6), example_freq_real()[4:5])
    assert r[0, 64:68].tolist() == pytest.approx([0.90731853, -0.9847991, 0.07121906, -1.0329854], rel=1e-6)
    h = hadamard128(r)
    assert h[0, :4].tolist() == pytest.approx([-0.27660272, 1.0588219, -0.18089381, 0.0581731], rel=1e-6)
    assert float(h.abs().max()) == pytest.approx(3.8548107, rel=1e-6)


def test_hadamard_is_sylvester() -> None:
    """hadamard128 = x @ H_128 (natural order) * rsqrtf(128), on exact small integers."""
    h = torch.ones(1, 1, dtype=torch.float64)
    for _ in range(7):
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    x = torch.randint(-8, 9, (4, 128), generator=torch.Generator().manual_seed(0)).to(F32)
    scale = f32_from_bits(0x3DB504F3)
    expected = ((x.double() @ h).to(F32)) * scale
    assert torch.equal(hadamard128(x), expected)


def test_example_indexer_fp8() -> None:
    """§12.2 FP8: payload at 2*8448 + 256, fp32 scale at 2*8448 + 8192 + 8."""
    fmt, page_size = layouts.INDEXER_FP8, 64
    x, w = example_indexer_input()
    cache = store_one(x, w, fmt, page_size, out_loc=130)
    assert fmt.page_bytes(page_size) == 8448
    data_at, scale_at = 2 * 8448 + 256, 2 * 8448 + 8192 + 8
    assert (data_at, scale_at) == (17152, 25096)
    data, scale = take(cache, data_at, 128), take(cache, scale_at, 4)
    assert scale.hex() == "d7f90c3c"  # 0x3C0CF9D7 = 0.008604488
    assert data[:2].hex() == "e06f"
    assert data[:16].hex() == "e06fdb4e61e36262e96e6067eed862eb"
    assert sha(data) == "f109fb1479ff3ed106dd367c89c215f499a4d4b7320f2cb623bfd253da5e7245"
    assert sha(data + scale) == "d4b776f29ccb3e48a52dcb9b6742eaacc1065c3e184f25f5b3bf31c4befb006d"
    assert_only_written(cache, [(data_at, 128), (scale_at, 4)])


def test_example_indexer_fp4() -> None:
    """§12.2 FP4: payload at 2*4352 + 128, ue8m0 scales at 2*4352 + 4096 + 8."""
    fmt, page_size = layouts.INDEXER_FP4, 64
    x, w = example_indexer_input()
    cache = store_one(x, w, fmt, page_size, out_loc=130)
    assert fmt.page_bytes(page_size) == 4352
    data_at, scale_at = 2 * 4352 + 128, 2 * 4352 + 4096 + 8
    assert (data_at, scale_at) == (8832, 12808)
    data, scales = take(cache, data_at, 64), take(cache, scale_at, 4)
    assert scales.hex() == "7d7e7e7f"
    assert data[0] == 0x6A
    assert data[:16].hex() == "6a09b3336d429ed34ce350dd5441aed3"
    assert sha(data) == "891552c8a7be4258477ee80d1c84df78b7b185ee66d6706a8dcee4a69cc6bd11"
    assert sha(data + scales) == "901b876186f48ef43fac51e4203a712836592558b2d48f66be58e00c05a6ee6c"
    assert_only_written(cache, [(data_at, 64), (scale_at, 4)])


@pytest.mark.parametrize("fmt", [layouts.MAIN_V4, layouts.INDEXER_FP8, layouts.INDEXER_FP4, layouts.BF16_ROWS])
def test_skipped_rows_are_not_read_or_written(fmt: layouts.CacheFormat) -> None:
    """Invalid rows (NaN data, out-of-table positions) write nothing; valid ones land at their slots."""
    page_size = 1 if fmt is layouts.BF16_ROWS else 4
    d = fmt.head_dim
    g = torch.Generator().manual_seed(1)
    kv = torch.randn(4, d, generator=g)
    kv[1] = float("nan")
    kv[3] = float("nan")
    positions = torch.tensor([4, 2**31, 0, -4])
    dest = torch.tensor([5, 6, 2, 7])
    valid = torch.tensor([True, False, True, False])
    pages = 8 if page_size == 1 else 2
    cache = torch.full((pages, fmt.page_bytes(page_size)), POISON, dtype=torch.uint8)
    kwargs = dict(norm_weight=torch.ones(d), norm_eps=1e-6, freq_real=example_freq_real(), page_size=page_size, fmt=fmt)
    norm_rope_store(kv, positions, dest, valid, kvcache=cache, **kwargs)
    # the same two rows stored alone, one call each
    ref = torch.full_like(cache, POISON)
    for r in (0, 2):
        norm_rope_store(kv[r : r + 1], positions[r : r + 1], dest[r : r + 1], valid[r : r + 1], kvcache=ref, **kwargs)
    assert torch.equal(cache, ref)
    assert int((cache != POISON).sum()) > 0
    none = torch.full_like(cache, POISON)
    norm_rope_store(kv, positions, dest, torch.zeros(4, dtype=torch.bool), kvcache=none, **kwargs)
    assert bool((none == POISON).all())


def test_bf16_input_rounds_weight_to_kv_dtype() -> None:
    """bf16 kv: the fp32 weight is first rounded to bf16 (spec §2 step 9)."""
    x, w = example_main_input()
    xb = x.to(torch.bfloat16)
    w_odd = w + 2.0**-12  # not representable in bf16
    a = store_one(xb, w_odd, layouts.MAIN_V4, 64, out_loc=130)
    b = store_one(xb.to(F32), w_odd.to(torch.bfloat16).to(F32), layouts.MAIN_V4, 64, out_loc=130)
    assert torch.equal(a, b)


# --------------------------------------------------------------------------
# page bytes
# --------------------------------------------------------------------------


@pytest.mark.parametrize("page_size,expected", [(1, 1152), (2, 1728), (64, 37440), (256, 149760)])
def test_v4_page_bytes(page_size: int, expected: int) -> None:
    assert layouts.MAIN_V4.page_bytes(page_size) == expected


def test_other_page_bytes() -> None:
    assert layouts.INDEXER_FP8.page_bytes(64) == 8448
    assert layouts.INDEXER_FP4.page_bytes(64) == 4352
    assert layouts.BF16_ROWS.page_bytes(1) == 1024
    assert layouts.MAIN_V4.bytes_per_token == 584


# --------------------------------------------------------------------------
# scalar conversions (§4.3)
# --------------------------------------------------------------------------


def codes(fn, values, **kw) -> list[int]:
    return fn(torch.tensor(values, dtype=F32), **kw).to(torch.int64).tolist()


def test_e4m3_pack_fp8_special_values() -> None:
    nan, inf = float("nan"), float("inf")
    vals = [448.0, 449.0, 464.0, 1000.0, -1000.0, nan, inf, -inf, 0.0, -0.0, 1.0, -1.0, 240.0, 2.0**-6]
    assert codes(quant.e4m3_codes, vals) == [
        0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x7E, 0x7E, 0xFE, 0x00, 0x80, 0x38, 0xB8, 0x77, 0x08,
    ]  # fmt: skip


def test_e4m3_satfinite_without_clip() -> None:
    vals = [float("nan"), 449.0, 480.0, -1e30, float("inf")]
    assert codes(quant.e4m3_codes, vals, clip=False) == [0x7F, 0x7E, 0x7E, 0xFE, 0x7E]


def test_e4m3_subnormals_and_ties() -> None:
    s = 2.0**-9
    vals = [s, 2 * s, 7 * s, 0.5 * s, 1.5 * s, 2.5 * s, 7.5 * s, 0.25 * s, -s, -0.5 * s, 0.51 * s]
    #        1   2    7    tie->0   tie->2   tie->2   tie->8  0   neg  -0     up
    assert codes(quant.e4m3_codes, vals) == [0x01, 0x02, 0x07, 0x00, 0x02, 0x02, 0x08, 0x00, 0x81, 0x80, 0x01]
    # normal-range ties go to the even code: 1 + 1/16 (0x38 | 0x39) -> 0x38, 1 + 3/16 (0x39 | 0x3A) -> 0x3A,
    # 2^-6 (1 + 1/16) -> 0x08, 432 (416 = 0x7D | 448 = 0x7E) -> 0x7E, 400 (384 = 0x7C | 416) -> 0x7C
    assert codes(quant.e4m3_codes, [1 + 1 / 16, 1 + 3 / 16, 2.0**-6 * (1 + 1 / 16), 416.0, 432.0, 400.0]) == [
        0x38, 0x3A, 0x08, 0x7D, 0x7E, 0x7C,
    ]  # fmt: skip


def test_e4m3_matches_torch_float8_in_range() -> None:
    """Inside +-448 the codes equal torch's RNE float8_e4m3fn cast; every finite code round-trips."""
    g = torch.Generator().manual_seed(0)
    x = torch.cat([
        torch.randn(20000, generator=g) * s for s in (1e-3, 0.05, 1.0, 30.0, 150.0)
    ]).clamp(-448, 448)  # fmt: skip
    ours = quant.e4m3_codes(x)
    ref = x.to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(ours, ref)
    all_codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    values = all_codes.view(torch.float8_e4m3fn).to(F32)
    assert torch.equal(quant.e4m3_codes(values), all_codes)


def test_bf16_bits() -> None:
    vals = [1.0, 1 + 2.0**-8, 1 + 3 * 2.0**-8, -2.0, float("inf"), float("-inf"), float("nan"), -0.0]
    got = [c & 0xFFFF for c in codes(quant.bf16_bits, vals)]
    assert got == [0x3F80, 0x3F80, 0x3F82, 0xC000, 0x7F80, 0xFF80, 0x7FFF, 0x8000]
    x = torch.randn(100000, generator=torch.Generator().manual_seed(2)) * 100
    assert torch.equal(quant.bf16_bits(x), x.to(torch.bfloat16).view(torch.int16))
    assert torch.equal(quant.bf16_round(x), x.to(torch.bfloat16).to(F32))


def test_e2m1_threshold_codes() -> None:
    vals = [0.0, 0.25, 0.26, 0.75, 0.76, 1.25, 1.75, 1.76, 2.5, 3.5, 3.6, 5.0, 5.01, 6.0, 100.0]
    assert codes(quant.e2m1_threshold_codes, vals) == [0, 0, 1, 1, 2, 2, 3, 4, 4, 5, 6, 6, 7, 7, 7]
    neg = [-0.0, -0.1, -0.25, -0.75, -1.75, -3.5, -6.0, -1e9, float("-inf")]
    assert codes(quant.e2m1_threshold_codes, neg) == [0, 0, 0, 0x9, 0xB, 0xD, 0xF, 0xF, 0xF]
    assert codes(quant.e2m1_threshold_codes, [float("nan"), float("inf")]) == [7, 7]


def test_ue8m0_ceil_and_inverse() -> None:
    above_one = f32_from_bits(0x3F800001)
    vals = [1.0, 2.0, 0.5, 2.0**-22, above_one, 1.5, 0.75, 2.0**100, 1e-4 / 448]
    assert codes(quant.ue8m0_ceil, vals) == [127, 128, 126, 105, 128, 128, 127, 227, 105]
    e = torch.tensor([127, 115, 105, 253, 1])
    assert quant.inv_ue8m0(e).tolist() == [1.0, 4096.0, 2.0**22, 2.0**-126, 2.0**126]
    # 2^(e-127) >= v and the next smaller power would not be
    v = torch.rand(1000, generator=torch.Generator().manual_seed(3)) * 10 + 1e-6
    ev = quant.ue8m0_ceil(v).to(torch.float64)
    assert bool((torch.pow(2.0, ev - 127) >= v.double()).all())
    assert bool((torch.pow(2.0, ev - 128) < v.double()).all())


def test_fma_f32_single_rounding() -> None:
    a, b = 1 + 2.0**-20, 1 + 2.0**-20
    c = float(torch.tensor(a, dtype=F32) * torch.tensor(b, dtype=F32))  # fp32(a*b) = 1 + 2^-19
    got = quant.fma_f32(torch.tensor([a]), torch.tensor([b]), torch.tensor([-c]))
    assert float(got) == 2.0**-40
    # a*b = 2^-24 (1 - 2^-36), c = 1 + 2^-23: the fp64 sum is a false tie; the fused result rounds down
    a, b, c = 2.0**-24 * (1 + 2.0**-18), 1 - 2.0**-18, 1 + 2.0**-23
    got = quant.fma_f32(torch.tensor([a]), torch.tensor([b]), torch.tensor([c]))
    assert float(got) == 1 + 2.0**-23
    naive = float(torch.tensor(a * b + c, dtype=torch.float64).to(F32))
    assert naive == 1 + 2.0**-22  # plain double rounding would have gone up


def test_quant_helpers_keep_shape() -> None:
    x = torch.randn(3, 5, 64)
    for fn in (quant.bf16_bits, quant.e4m3_codes, quant.e2m1_threshold_codes):
        assert fn(x).shape == x.shape
    assert quant.ue8m0_ceil(x.abs() + 1).shape == x.shape
    assert math.isclose(float(quant.inv_ue8m0(torch.tensor(128))), 0.5)
