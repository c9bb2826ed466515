"""fp4 / fp8 encoders of the V4.1 low-ratio layers (spec ``v41.md`` §2.2, §5.2, §7.3), as torch ops.

All functions take fp32 tensors whose last dim is a multiple of the block
size and work on blocks of consecutive values along it.

``e2m1_rne_codes(x)``
    ``cvt.rn.satfinite.e2m1x2.f32`` semantics: round half to even on the grid
    {0, .5, 1, 1.5, 2, 3, 4, 6}, saturate at 6, sign bit kept (``-0`` and a
    small negative give code 0x8); NaN gives 0x7 (+6), as CUDA's software
    conversion on sm_90 does.
``fake_quant_kv(u)``
    the compressed-KV fake quantisation: per 16 values
    ``S = e4m3(clamp(amax * (1/6), 2^-9, 448))``, ``q = e2m1(u / S + 0) * S``.
``encode(q, u, layout)``
    data and scale bytes of one latent row per layout (``q`` the fake-quantised
    row for the fp8 layouts, ``u`` the rotated row for the fp4 ones).
``index_k_codes(k)``
    the two-stage fp4 quantiser of the index keys (payload + 4 ue8m0 bytes).
"""

from __future__ import annotations

import torch

from ..layouts import MAIN_V4
from ..v41.layouts import KVLayout
from . import store
from .quant import e4m3_codes, inv_ue8m0, ue8m0_ceil

__all__ = ["e2m1_rne_codes", "e2m1_values", "e4m3_values", "fake_quant_kv", "encode", "index_k_codes",
           "pack_nibbles"]

_F32 = torch.float32
# nearest-even rounding on the e2m1 grid: a magnitude's code is the number of
# midpoints it passes; ties round up exactly at the midpoints whose upper
# neighbour has an even code (0.75 -> 1.0, 1.75 -> 2, 3.5 -> 4)
_MIDPOINTS_DOWN = (0.25, 1.25, 2.5, 5.0)  # ties go to the lower (even) code
_MIDPOINTS_UP = (0.75, 1.75, 3.5)  # ties go to the upper (even) code
_E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP4_MAX = 6.0
# fp32(1/6) as the kernels spell it (0.16666667f)
INV_FP4_MAX = float(torch.tensor(1.0 / 6.0, dtype=_F32))
KV_SCALE_MIN = 2.0**-9
KV_SCALE_MAX = 448.0
KV_BLOCK = 16  # values per e4m3 scale (fake quant and V41_FP4)
V41_FP8_TILE = 32  # values per ue8m0 exponent of the V41 encoding
V41_MIN_EXPONENT = 114  # ue8m0_ceil(1e-4)
INDEX_K_BLOCK = 32
INDEX_K_STAGE1_FLOOR = 6.0 * 2.0**-126
INDEX_K_STAGE2_FLOOR = 1e-4


def _blocks(x: torch.Tensor, size: int) -> torch.Tensor:
    return x.reshape(*x.shape[:-1], x.shape[-1] // size, size)


def e2m1_rne_codes(x: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (``uint8`` in 0..15) of fp32 ``x``: RNE, satfinite, sign bit kept."""
    a = x.abs()
    mag = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for m in _MIDPOINTS_DOWN:
        mag += a > m
    for m in _MIDPOINTS_UP:
        mag += a >= m
    mag = torch.where(torch.isnan(x), torch.full_like(mag, 7), mag)
    sign = torch.signbit(x) & ~torch.isnan(x)
    return mag | (sign.to(torch.uint8) << 3)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """fp32 values of e2m1 codes (bit 3 = sign; code 0x8 reads as -0.0)."""
    grid = torch.tensor(_E2M1_GRID, dtype=_F32, device=codes.device)
    mag = grid[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def e4m3_values(codes: torch.Tensor) -> torch.Tensor:
    """fp32 values of OCP E4M3FN codes."""
    return codes.view(torch.float8_e4m3fn).to(_F32)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """``[..., 2k]`` 4-bit codes -> ``[..., k]`` bytes, even index in the low nibble."""
    pairs = codes.reshape(*codes.shape[:-1], -1, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def _kv_scales(u: torch.Tensor, divide: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-16 e4m3 scales of ``u`` ``[n, D]``: (codes ``[n, D/16]``, fp32 values).

    ``divide`` = ``amax / 6`` (the V41_FP4 encoder), else ``amax * fp32(1/6)`` (the fake quant).
    """
    amax = store._amax(_blocks(u, KV_BLOCK))
    raw = store._div(amax, FP4_MAX) if divide else amax * INV_FP4_MAX
    codes = e4m3_codes(raw.clamp(KV_SCALE_MIN, KV_SCALE_MAX), clip=False)
    return codes, e4m3_values(codes)


def fake_quant_kv(u: torch.Tensor) -> torch.Tensor:
    """Compressed-KV fp4 fake quantisation of rotated rows ``u`` ``[n, 512]`` (bf16-exact fp32)."""
    _, scale = _kv_scales(u, divide=False)
    s = scale.unsqueeze(-1)
    # "+ 0.0" turns an exact -0 quotient into +0; a small negative still reads back as -0
    quotient = _blocks(u, KV_BLOCK) / s + 0.0
    return (e2m1_values(e2m1_rne_codes(quotient)) * s).reshape(u.shape)


def _encode_v41_fp8(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    tiles = _blocks(q, V41_FP8_TILE)
    bits = store._amax(tiles).view(torch.int32).to(torch.int64)
    exponent = (bits >> 23) - 8 + ((bits & 0x7FFFFF) > 0x600000).to(torch.int64)
    e = exponent.clamp_min(V41_MIN_EXPONENT)  # = ue8m0_ceil(max(amax / 448, 1e-4))
    codes = e4m3_codes(tiles * inv_ue8m0(e).unsqueeze(-1), clip=False)
    return codes.reshape(q.shape), e.to(torch.uint8)


def _encode_v41_fp4(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale_codes, scale = _kv_scales(u, divide=True)
    codes = e2m1_rne_codes(_blocks(u, KV_BLOCK) / scale.unsqueeze(-1)).reshape(u.shape)
    return pack_nibbles(codes), scale_codes


def encode(q: torch.Tensor, u: torch.Tensor, layout: KVLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """(data bytes ``[n, data_bytes]``, written scale bytes ``[n, k]``) of latent rows in ``layout``.

    ``u`` is the rotated bf16 row, ``q = fake_quant_kv(u)``; the fp4 layouts
    encode ``u`` directly, the others quantise ``q``.  V4 writes 7 of its 8
    scale bytes (the pad byte is never written), UNIFORM_FP8 none.
    """
    enc = layout.encoding
    if enc == "v41_fp4":
        return _encode_v41_fp4(u)
    if enc == "v41_fp8":
        return _encode_v41_fp8(q)
    if enc == "v4":
        return store.encode_rows(q, MAIN_V4)
    return e4m3_codes(q, clip=True), q.new_empty((q.shape[0], 0), dtype=torch.uint8)


def index_k_codes(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two-stage fp4 quantisation of rotated index keys ``k`` ``[n, 128]`` (spec §5.2 steps 3-4).

    Stage 1 fake-quantises per 32 dims with a power-of-two scale
    ``2^(e1-127)``, ``e1 = ue8m0_ceil(max(amax, 6*2^-126) * fp32(1/6))``;
    stage 2 re-quantises the stage-1 values with
    ``e2 = clamp(ue8m0_ceil(max(amax / 6, 1e-4)), 1, 254)``.  Returns
    (payload ``[n, 64]`` of e2m1 pairs, ``e2`` bytes ``[n, 4]``); a negative
    zero code is stored as 0.
    """
    blocks = _blocks(k, INDEX_K_BLOCK)
    e1 = ue8m0_ceil(store._amax(blocks).clamp_min(INDEX_K_STAGE1_FLOOR) * INV_FP4_MAX).unsqueeze(-1)
    v = e2m1_values(e2m1_rne_codes(blocks * inv_ue8m0(e1))) * (e1 << 23).view(_F32)
    e2 = ue8m0_ceil(store._div(store._amax(v), FP4_MAX).clamp_min(INDEX_K_STAGE2_FLOOR)).clamp(1, 254)
    codes = e2m1_rne_codes(v * inv_ue8m0(e2).unsqueeze(-1))
    codes = torch.where(codes == 8, torch.zeros_like(codes), codes)
    return pack_nibbles(codes.reshape(k.shape)), e2.to(torch.uint8)
