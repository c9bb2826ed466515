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
//
// The reference is python/flashcompress/torch_backend/v41_quant.py.
#pragma once

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

}  // namespace v41q
}  // namespace flashcompress
