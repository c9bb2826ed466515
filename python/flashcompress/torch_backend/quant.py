"""Exact scalar conversions of the store step, as vectorised torch ops.

Every helper works element-wise on a tensor of any shape and on any device;
none of them leaves the device or loops in Python.  The definitions follow
``spec/store-and-jit.md`` §4.3 (CUDA semantics):

``bf16_bits(x)``
    RNE fp32 -> bf16, returned as the 16-bit pattern (``int16``).  NaN gives
    the canonical quiet NaN 0x7FFF, as ``__float2bfloat16_rn`` does.
``clip448(x)``
    ``fmaxf(fminf(x, 448), -448)``: NaN -> +448, +-inf -> +-448.
``e4m3_codes(x, clip=True)``
    OCP E4M3FN code (``uint8``) with round-to-nearest-even and
    saturate-to-finite (``cvt.rn.satfinite.e4m3x2.f32``).  ``clip=True`` first
    applies :func:`clip448` (this is ``pack_fp8``: NaN -> 0x7E); with
    ``clip=False`` NaN -> 0x7F and |x| > 448 saturates to +-448.  The sign is
    kept, so -0.0 and negatives that round to zero give 0x80.
``ue8m0_ceil(x)``
    for positive normal fp32 ``x``: the biased exponent, plus one if any
    mantissa bit is set, i.e. the ``e`` of the smallest 2^(e-127) >= x
    (``int32``).
``inv_ue8m0(e)``
    the fp32 2^(127-e), built from its bit pattern ``(254 - e) << 23``
    (exact for 1 <= e <= 253).
``fma_f32(a, b, c)``
    correctly rounded fp32 ``a*b + c`` (what a CUDA ``fmaf`` / contracted
    expression computes), emulated in fp64 with round-to-odd.
``e2m1_threshold_codes(x)``
    OCP FP4 code (``uint8``, low nibble) by threshold rounding: magnitude code
    = number of thresholds {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5} that
    ``min(|x|, 6)`` strictly exceeds (ties toward zero; NaN -> 6 -> code 7);
    the sign bit 0x8 is set only for ``x < 0`` with a non-zero code.

All inputs are converted to fp32 first (exactly, for any narrower float).
"""

from __future__ import annotations

import torch

FP8_E4M3_MAX = 448.0
E4M3_MAX_CODE = 0x7E  # 448
E4M3_NAN_CODE = 0x7F
_E4M3_MIN_NORMAL = 2.0**-6
_E4M3_SUBNORMAL_INV_STEP = 2.0**9
# fp32 exponent bias minus e4m3 exponent bias, shifted onto the 3 kept mantissa bits
_E4M3_REBIAS = (127 - 7) << 3
_E2M1_THRESHOLDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E2M1_MAX = 6.0


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float32 else x.to(torch.float32)


def _bits(x: torch.Tensor) -> torch.Tensor:
    """fp32 bit patterns widened to int64 (non-negative: the unsigned value)."""
    return _f32(x).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def bf16_bits(x: torch.Tensor) -> torch.Tensor:
    """RNE bf16 bit patterns (``int16``) of ``x`` taken as fp32."""
    x = _f32(x)
    b = _bits(x)
    rounded = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    rounded = torch.where(torch.isnan(x), torch.full_like(rounded, 0x7FFF), rounded)
    # 16-bit patterns >= 0x8000 become the negative int16 with the same bits
    return torch.where(rounded >= 0x8000, rounded - 0x10000, rounded).to(torch.int16)


def bf16_round(x: torch.Tensor) -> torch.Tensor:
    """``float(bf16(x))``: the fp32 value of the RNE bf16 rounding of ``x``."""
    return (bf16_bits(x).to(torch.int32) << 16).view(torch.float32)


def clip448(x: torch.Tensor) -> torch.Tensor:
    """``fmaxf(fminf(x, 448), -448)`` in fp32 (NaN -> +448)."""
    x = _f32(x)
    x = torch.where(torch.isnan(x), torch.full_like(x, FP8_E4M3_MAX), x)
    return x.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)


def e4m3_codes(x: torch.Tensor, clip: bool = True) -> torch.Tensor:
    """OCP E4M3FN codes (``uint8``), RNE + satfinite; ``clip`` = apply :func:`clip448` first."""
    x = clip448(x) if clip else _f32(x)
    b = _bits(x)
    sign = (b >> 24) & 0x80
    a = x.abs()
    # normal range: drop 20 of the 23 fp32 mantissa bits with RNE; a carry
    # ripples into the exponent field, which is what we want
    mag = b & 0x7FFFFFFF
    normal = ((mag + 0x7FFFF + ((mag >> 20) & 1)) >> 20) - _E4M3_REBIAS
    # subnormal range (|x| < 2^-6): multiples of 2^-9; the product is exact and
    # torch.round is half-to-even.  Code 8 (= 2^-6) is also the right normal code.
    sub = torch.round(a * _E4M3_SUBNORMAL_INV_STEP).to(torch.int64)
    code = torch.where(a < _E4M3_MIN_NORMAL, sub, normal).clamp(max=E4M3_MAX_CODE)
    code = torch.where(torch.isnan(x), torch.full_like(code, E4M3_NAN_CODE), code | sign)
    return code.to(torch.uint8)


def ue8m0_ceil(x: torch.Tensor) -> torch.Tensor:
    """Biased exponent of the smallest power of two >= ``x`` (positive normal fp32), as ``int32``."""
    b = _bits(x)
    e = (b >> 23) & 0xFF
    return (e + ((b & 0x7FFFFF) != 0).to(torch.int64)).to(torch.int32)


def inv_ue8m0(e: torch.Tensor) -> torch.Tensor:
    """fp32 2^(127 - e) for integer exponent bytes ``e`` (1 <= e <= 253)."""
    return ((254 - e.to(torch.int32)) << 23).view(torch.float32)


def e2m1_threshold_codes(x: torch.Tensor) -> torch.Tensor:
    """FP4 e2m1 codes (``uint8`` in 0..15) by threshold rounding, ties toward zero."""
    x = _f32(x)
    a = x.abs()
    a = torch.where(torch.isnan(a) | (a > E2M1_MAX), torch.full_like(a, E2M1_MAX), a)
    thr = torch.tensor(_E2M1_THRESHOLDS, dtype=torch.float32, device=x.device)
    mag = (a.unsqueeze(-1) > thr).sum(-1)
    neg = (x < 0) & (mag != 0)
    return (mag + neg.to(mag.dtype) * 8).to(torch.uint8)


def fma_f32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Fused fp32 ``a * b + c`` with a single rounding.

    ``a * b`` is exact in fp64; the fp64 sum is made round-to-odd (its error
    term from TwoSum sets the sticky bit), which makes the final rounding to
    fp32 correct (53 >= 24 + 2 bits, no double-rounding error).
    """
    p = _f32(a).to(torch.float64) * _f32(b).to(torch.float64)
    c64 = _f32(c).to(torch.float64)
    s = p + c64
    bp = s - c64
    err = (p - bp) + (c64 - (s - bp))
    bits = s.view(torch.int64)
    inexact_even = (err != 0) & ((bits & 1) == 0) & torch.isfinite(s)
    # step one ulp towards the exact value: magnitude up iff err and s share a sign
    step = torch.where((err > 0) == (s > 0), 1, -1)
    bits = torch.where(inexact_even, bits + step, bits)
    return bits.view(torch.float64).to(torch.float32)
