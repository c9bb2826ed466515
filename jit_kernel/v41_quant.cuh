// flashcompress: the fp4 / fp8 scalar helpers of the V4.1 low-ratio ops (spec v41.md §2.2, §5.2,
// §7.3), exact in software and usable from host and device code (quant.cuh conventions).
//
//   e2m1_rne(x)      RNE-e2m1 code (0..15) of fp32 x: round half to even on the grid
//                    {0, .5, 1, 1.5, 2, 3, 4, 6}, saturate at 6, sign bit kept (-0 and small
//                    negatives give 0x8); NaN -> 0x7. The midpoint comparisons below are the
//                    exact decision boundaries, so for every finite (and infinite) input this is
//                    the code of cvt.rn.satfinite.e2m1x2.f32 and of the double-precision
//                    emulation of __nv_cvt_float2_to_fp4x2 (sm_90 has no e2m1 instruction):
//                    7 compares and adds instead of the emulation's conversions through double.
//   e2m1_value(c)    fp32 value of an e2m1 code (bit 3 = sign; 0x8 reads as -0.0)
//   e4m3_value(c)    fp32 value of a non-NaN OCP E4M3FN code
//   fake_quant_grid(u, s, r)  e2m1_value(e2m1_rne(u / s + 0)), the fake-quant grid value of
//                    spec §2.2 before the scale multiply, for r = recip_e4m3(s): div_by's two
//                    FMAs, then |q| + c - c with ulp(c) = the grid step (0.5 / 1 / 2: RNE on the
//                    grid, as the code's parity is the value's), clamped at 6, with the sign of
//                    q0 = u r (no NaN / sign fix-ups needed). Equal, bit for bit, for every bf16
//                    u and every e4m3 s in [2^-9, 448] (host check below).
//   fp4_code(u, s, r) e2m1_rne(u / s) for r = recip_e4m3(s): the same FMAs and grid rounding,
//                    the code read off the grid value, the sign (also of a zero) u's. Equal for
//                    every bf16 u and every e4m3 s in [2^-9, 448] (host check below).
//   recip_e4m3(s)    rn(1 / s) of a positive e4m3 value s (2^-9 <= s <= 448), exactly: s = M 2^E
//                    with M = 1 + k / 8, so 1 / s = rn(8 / (8 + k)) 2^-E (a table of 8 rounded
//                    mantissas; the power-of-two scaling is exact in this range)
//   v41_tile_exponent(amax)  ue8m0 exponent of a V41 fp8 tile from its amax (bit arithmetic)
//   fp4_scale_code(raw)      e4m3 code of a per-16 fp4 scale, clamped to [2^-9, 448]
//   div_by(u, s, r)  rn(u / s) for r = recip_e4m3(s), without a division: q0 = u r, then one FMA
//                    correction (Markstein); the sign of a zero quotient is u's. For every bf16
//                    u (all 65536 patterns: zeros, subnormals, inf, NaN) and every e4m3 s in
//                    [2^-9, 448]: bit-identical to the IEEE quotient when |u| >= 2^-122 (NaN:
//                    a NaN), and always the same e2m1_rne code, sign included (below 2^-122 the
//                    FMA remainder underflows; both quotients are then < 2^-113, code 0 / 0x8).
//                    The fast kernels divide only such pairs (and max(amax, 1e-4f) / 448, also
//                    checked) and use a quotient only through its e2m1 code, an e4m3 scale
//                    clamped at 2^-9 or a ue8m0 exponent.
// Host check, exhaustive over those domains: tests/native/v41_div_host.cpp (run by
// tests/test_v41_kernel_build.py).
//
// The reference is python/flashcompress/torch_backend/v41_quant.py.
#pragma once

#include <cmath>
#include <cstdint>

#include "quant.cuh"

namespace flashcompress {
namespace v41q {

FC_QUANT_FN uint32_t e2m1_rne(float x) {
  const uint32_t b = quant::float_bits(x);
  if (quant::is_nan_bits(b)) return 0x7u;
  const float a = quant::bits_float(b & 0x7FFFFFFFu);
  // magnitude code = midpoints passed; ties at 0.25 / 1.25 / 2.5 / 5 stay on the lower (even)
  // code, ties at 0.75 / 1.75 / 3.5 go to the upper (even) one
  const uint32_t mag = static_cast<uint32_t>(a > 0.25f) + static_cast<uint32_t>(a >= 0.75f) +
                       static_cast<uint32_t>(a > 1.25f) + static_cast<uint32_t>(a >= 1.75f) +
                       static_cast<uint32_t>(a > 2.5f) + static_cast<uint32_t>(a >= 3.5f) +
                       static_cast<uint32_t>(a > 5.0f);
  return mag | ((b >> 28) & 0x8u);
}

FC_QUANT_FN float e2m1_value(uint32_t code) {
  const uint32_t m = code & 7u;
  // m >= 2: 2^((m >> 1) - 1) * (1 + (m & 1) / 2); m = 1: 0.5; m = 0: 0
  uint32_t bits = m >= 2 ? (((m >> 1) + 126u) << 23) | ((m & 1u) << 22) : (m == 1 ? 0x3F000000u : 0u);
  bits |= (code & 8u) << 28;
  return quant::bits_float(bits);
}

FC_QUANT_FN float e4m3_value(uint32_t code) {
  const uint32_t e = (code >> 3) & 0xFu, m = code & 7u;
  const float mag = e == 0 ? static_cast<float>(m) * 0.001953125f  // m * 2^-9 (exact)
                           : quant::bits_float(((e + 120u) << 23) | (m << 20));
  return (code & 0x80u) ? -mag : mag;
}

FC_QUANT_FN float recip_e4m3(float s) {
  const uint32_t b = quant::float_bits(s);
  const uint32_t k = (b >> 20) & 7u;
  // rn(8 / (8 + k)), k = 0..7 (a select tree: no indexed array, so nothing goes to local memory)
  const uint32_t t = (k & 4u) ? ((k & 2u) ? ((k & 1u) ? 0x3F088889u : 0x3F124925u)
                                          : ((k & 1u) ? 0x3F1D89D9u : 0x3F2AAAABu))
                              : ((k & 2u) ? ((k & 1u) ? 0x3F3A2E8Cu : 0x3F4CCCCDu)
                                          : ((k & 1u) ? 0x3F638E39u : 0x3F800000u));
  return quant::bits_float(t - ((b & 0x7F800000u) - 0x3F800000u));
}

// u / s from r = recip_e4m3(s): q0 = u r and q, q0 with one fma correction (u = +-inf makes the
// correction inf - inf: the callers then keep q0).
FC_QUANT_FN void quotient(float u, float s, float r, float& q0, float& q) {
#if defined(__CUDA_ARCH__)
  q0 = __fmul_rn(u, r);
  q = __fmaf_rn(__fmaf_rn(-q0, s, u), r, q0);
#else
  q0 = u * r;
  q = std::fmaf(std::fmaf(-q0, s, u), r, q0);
#endif
}

FC_QUANT_FN float div_by(float u, float s, float r) {
  float q0, q;
  quotient(u, s, r, q0, q);
  const uint32_t qb = quant::float_bits(q);
  // NaN quotients (u NaN, or u = +-inf: inf - inf in the correction) keep q0 (inf or NaN, as u / s)
  const uint32_t fixed = quant::is_nan_bits(qb) ? quant::float_bits(q0) : qb;
  return quant::bits_float((fixed & 0x7FFFFFFFu) | (quant::float_bits(u) & 0x80000000u));
}

FC_QUANT_FN float fake_quant_grid(float u, float s, float r) {
  float q0, q;
  quotient(u, s, r, q0, q);
  const float a = fabsf(q);  // NaN for u = +-inf (inf - inf in the correction) or NaN
  const float c = a < 2.0f ? 4194304.0f : (a < 4.0f ? 8388608.0f : 16777216.0f);
#if defined(__CUDA_ARCH__)
  const float m = fminf(__fadd_rn(__fadd_rn(a, c), -c), 6.0f);  // fminf(NaN, 6) = 6
#else
  const volatile float sum = a + c;
  const float m = fminf(sum - c, 6.0f);
#endif
  return q0 < 0.0f ? -m : m;  // q0 = u r carries u's sign (+-inf included; NaN: not negative)
}

FC_QUANT_FN uint32_t fp4_code(float u, float s, float r) {
  float q0, q;
  quotient(u, s, r, q0, q);
  const float a = fabsf(q);
  const float c = a < 2.0f ? 4194304.0f : (a < 4.0f ? 8388608.0f : 16777216.0f);
#if defined(__CUDA_ARCH__)
  const float m = fminf(__fadd_rn(__fadd_rn(a, c), -c), 6.0f);
#else
  const volatile float sum = a + c;
  const float m = fminf(sum - c, 6.0f);
#endif
  // grid value -> code: 1, 1.5, 2, 3, 4, 6 have bits >> 22 = 254 .. 259 (codes 2 .. 7), 0.5 is 1
  const uint32_t mb = quant::float_bits(m);
  const uint32_t mag = mb >= 0x3F800000u ? (mb >> 22) - 252u : (mb != 0u ? 1u : 0u);
  const uint32_t ub = quant::float_bits(u);
  return quant::is_nan_bits(ub) ? 0x7u : (mag | ((ub >> 28) & 0x8u));  // the quotient's sign is u's
}

// ue8m0 exponent of a V41 fp8 tile (32 values) whose max |value| is amax >= 0, from its bits:
// biased_exp(amax) - 8 + [mantissa(amax) > 0x600000], at least 114 -- exactly
// ue8m0_ceil(max(amax / 448, 1e-4)) (448 = 1.75 * 2^8; 2^-13 = ceil_pow2(1e-4)). spec v41.md §7.3.
FC_QUANT_FN uint32_t v41_tile_exponent(float amax) {
  const uint32_t bits = quant::float_bits(amax);
  const int32_t e = static_cast<int32_t>(bits >> 23) - 8 + ((bits & 0x7FFFFFu) > 0x600000u ? 1 : 0);
  return static_cast<uint32_t>(e < 114 ? 114 : e);
}

// e4m3 code of a per-16 fp4 scale: e4m3_RNE(clamp(raw, 2^-9, 448)) (always positive, finite;
// a NaN raw clamps to 2^-9). spec v41.md §7.3.
FC_QUANT_FN uint32_t fp4_scale_code(float raw) {
  return quant::e4m3_code(fminf(fmaxf(raw, 0.001953125f), quant::kE4m3Max));
}

}  // namespace v41q
}  // namespace flashcompress
