// flashcompress: the scalar primitives of the v41 design "fast3" (v41_fast3.cuh), host- and
// device-usable where they are plain arithmetic (quant.cuh conventions), each equal bit for bit
// to what the other designs compute on its domain:
//
//   e4m3_value_pos(c)  fp32 value of a non-negative, non-NaN E4M3FN code c (0..0x7E): the code's
//                      bits placed at fp32 bits 26..20 are the value times 2^-120 (a normal fp32
//                      for exponent field > 0, the fp32 subnormal m 2^-129 for exponent 0), so
//                      one exact multiply by 2^120 gives it (v41q::e4m3_value's sign-free case;
//                      needs subnormal arithmetic, which the family's flags keep: no ftz).
//   scale_code_hw(x)   e4m3 code of fminf(fmaxf(x, 2^-9), 448) (the fp4 / fake-quant scale byte,
//                      kv_scale_code of v41_common.cuh): one cvt.rn.satfinite.e4m3x2.f32 on
//                      sm_89+ (quant.cuh: the hardware conversion has the software encoder's
//                      semantics for every input), the software encoder elsewhere.
//   recip_refine(s, r0) rn(1 / s) for a positive e4m3 value s in [2^-9, 448] from any r0 within
//                      16 ulps of it (rcp.approx.f32: relative error < 2^-22, 4 ulps): one Newton
//                      step in two FMAs (v41q::recip_e4m3's value without its select tree).
//   fake_quant_grid_fast3(u, s, r)  v41q::fake_quant_grid with the rounding constant read off
//                      max(|q|, 1) 2^22 (a max, a multiply and a mask instead of two compares and
//                      selects) and the sign of q0 = u r + 0 (u r but +0 for u = -0) copied onto
//                      the grid magnitude by one bit operation instead of a compare and select:
//                      equal to it for every u but NaNs with the sign bit set, which the kernels
//                      never pass (their u come out of cvt.rn.bf16x2, whose NaN is +0x7FFF).
//   fp4_code_fast3(u, s, r)  v41q::fp4_code from the same grid value as fake_quant_grid_fast3: the
//                      magnitude code is the grid value times 2^-126 read as bits >> 22 (e2m1 code
//                      2e + m of (1 + m / 2) 2^(e - 1) is the fp32 exponent / top mantissa bit of
//                      its scaled value, e = 0 falling into the subnormals as m 2^22), the sign u's;
//                      equal to fp4_code for every u but negative-signed NaNs (a +NaN u gives 7, as
//                      its grid value is 6).
//   pack_fp8x4_no_nan(a, b, c, d)  quant::pack_fp8x4 for non-NaN inputs (the kernels' fake-quant
//                      values times a power of two): on sm_89+ the two conversions without the
//                      fminf that maps a NaN to 448 (satfinite clamps +-inf to +-448 as clip448).
//   max_nan(a, b)      max.NaN.f32: NaN if either is NaN, else fmaxf.
// Host checks (tests/native/v41_fast3_host.cpp): e4m3_value_pos against v41q::e4m3_value for
// every such code; recip_refine for every e4m3 s in [2^-9, 448] and every r0 within 16 ulps;
// fake_quant_grid_fast3 / fp4_code_fast3 against fake_quant_grid / fp4_code for every bf16 u (but
// negative NaNs) and every such s; the pair weight's clamp (fp32(exp(-104)) = +0).
#pragma once

#include <cmath>
#include <cstdint>

#include "quant.cuh"
#include "v41_quant.cuh"

namespace flashcompress {
namespace v41q {

FC_QUANT_FN float e4m3_value_pos(uint32_t code) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(quant::bits_float(code << 20), 0x1p120f);
#else
  const volatile float scaled = quant::bits_float(code << 20);  // keep the multiply (subnormal input)
  return scaled * 0x1p120f;
#endif
}

FC_QUANT_FN uint32_t scale_code_hw(float x) {
  const float lo = fmaxf(x, 0.001953125f);  // NaN -> 2^-9
#if FC_QUANT_HW_E4M3
  // satfinite maps everything above 448 (+inf included) to 448's code, as the clamp would
  // the second source goes to the low byte; the first, +0, makes the high byte 0x00
  uint32_t pair;
  asm("{\n\t.reg .b16 p;\n\tcvt.rn.satfinite.e4m3x2.f32 p, %1, %2;\n\tcvt.u32.u16 %0, p;\n\t}"
      : "=r"(pair) : "f"(0.0f), "f"(lo));
  return pair;
#else
  return quant::e4m3_code(fminf(lo, quant::kE4m3Max));
#endif
}

FC_QUANT_FN uint32_t pack_fp8x4_no_nan(float a, float b, float c, float d) {
#if FC_QUANT_HW_E4M3
  // the two byte pairs joined by one mov (first source of each cvt -> its upper byte)
  uint32_t w;
  asm("{\n\t.reg .b16 lo, hi;\n\t"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n\t"
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n\t"
      "mov.b32 %0, {lo, hi};\n\t}"
      : "=r"(w) : "f"(a), "f"(b), "f"(c), "f"(d));
  return w;
#else
  return quant::pack_fp8x4(a, b, c, d);
#endif
}

FC_QUANT_FN float recip_refine(float s, float r0) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(r0, __fmaf_rn(-s, r0, 1.0f), r0);
#else
  return std::fma(r0, std::fma(-s, r0, 1.0f), r0);
#endif
}

// min(RNE of |q| on the e2m1 grid, 6) (the grid magnitude of fake_quant_grid / fp4_code).
FC_QUANT_FN float e2m1_grid_magnitude(float q) {
  const float a = fabsf(q);
  // c = 2^22 2^floor(log2(max(a, 1))): ulp(c) is the grid step at a (0.5 below 2, 1 on [2, 4),
  // 2 on [4, 8), larger where only the clamp at 6 matters; +inf past 2^105, where a + c - c is
  // NaN and the clamp gives 6, as for a NaN a, whose max with 1 is 1)
#if defined(__CUDA_ARCH__)
  const float c = quant::bits_float(quant::float_bits(__fmul_rn(fmaxf(a, 1.0f), 4194304.0f)) & 0x7F800000u);
  const float m = fminf(__fadd_rn(__fadd_rn(a, c), -c), 6.0f);
#else
  const volatile float scaled = fmaxf(a, 1.0f) * 4194304.0f;
  const float c = quant::bits_float(quant::float_bits(scaled) & 0x7F800000u);
  const volatile float sum = a + c;
  const float m = fminf(sum - c, 6.0f);
#endif
  return m;
}

FC_QUANT_FN float fake_quant_grid_fast3(float u, float s, float r) {
  // q0 = u r + 0 (= u r but for u = -0, where it is +0: fake_quant_grid's "q0 < 0" is false there)
#if defined(__CUDA_ARCH__)
  const float q0 = __fmaf_rn(u, r, 0.0f);
  const float q = __fmaf_rn(__fmaf_rn(-q0, s, u), r, q0);
#else
  const float q0 = std::fma(u, r, 0.0f);
  const float q = std::fma(std::fma(-q0, s, u), r, q0);
#endif
  const float m = e2m1_grid_magnitude(q);
  return quant::bits_float(quant::float_bits(m) | (quant::float_bits(q0) & 0x80000000u));
}

FC_QUANT_FN uint32_t fp4_code_fast3(float u, float s, float r) {
  float q0, q;
  quotient(u, s, r, q0, q);
#if defined(__CUDA_ARCH__)
  const float scaled = __fmul_rn(e2m1_grid_magnitude(q), 0x1p-126f);
#else
  const volatile float scaled = e2m1_grid_magnitude(q) * 0x1p-126f;
#endif
  return (quant::float_bits(scaled) >> 22) | ((quant::float_bits(u) >> 28) & 0x8u);
}

}  // namespace v41q

namespace v41 {

#if defined(__CUDACC__) || defined(__HIPCC__)
// rn(1 / s) of a positive e4m3 scale s in [2^-9, 448] (v41q::recip_e4m3's value).
__device__ __forceinline__ float recip_e4m3_fast3(float s) {
#if defined(__CUDA_ARCH__)
  float r0;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(s));
  return v41q::recip_refine(s, r0);
#else
  return v41q::recip_e4m3(s);
#endif
}
#endif

#if defined(__CUDACC__) || defined(__HIPCC__)
__device__ __forceinline__ float max_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || b != b) ? __int_as_float(0x7FFFFFFF) : fmaxf(a, b);
#endif
}
#endif

}  // namespace v41
}  // namespace flashcompress
