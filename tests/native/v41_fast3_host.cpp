// Host check of the scalar primitives of design fast3 (jit_kernel/v41_fast3_math.cuh):
//   * v41q::e4m3_value_pos(c) equals v41q::e4m3_value(c) bit for bit for every non-negative,
//     non-NaN E4M3FN code (0x00..0x7E), the scale codes that kv_scale_code can give;
//   * v41q::recip_refine(s, r0) is rn(1 / s) for every e4m3 s in [2^-9, 448] and every r0 within
//     16 ulps of rn(1 / s) (the device's r0, rcp.approx.f32, is within 2^-22 of 1 / s: 4 ulps);
//   * v41q::fake_quant_grid_fast3(u, s, r) equals v41q::fake_quant_grid bit for bit, and
//     v41q::fp4_code_fast3 v41q::fp4_code, for every bf16 u but the NaNs with the sign bit set
//     (never a kernel's input) and every such s;
//   * the fast3 pair weight's clamp: fp32(exp(-104)) (libdevice's fast path, as replayed by
//     v41_exp_host.cpp, and glibc) is +0, so the exp of min(|d|, 104) is pair_weight's value
//     for every |d| >= 104.
// Prints the counts; exits 1 on any mismatch (tests/test_v41_kernel_build.py).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "libdevice_exp_host.h"
#include "v41_fast3_math.cuh"

using namespace flashcompress;

int main() {
  long long value_bad = 0;
  for (uint32_t c = 0; c <= 0x7Eu; ++c) {
    if (quant::float_bits(v41q::e4m3_value_pos(c)) != quant::float_bits(v41q::e4m3_value(c))) {
      if (++value_bad <= 4) std::printf("e4m3_value_pos code %u\n", c);
    }
  }
  long long recip_bad = 0, grid_bad = 0, grid_checked = 0;
  for (uint32_t code = 1; code <= 0x7Eu; ++code) {
    const float sv = v41q::e4m3_value(code);
    if (!(sv >= 0.001953125f && sv <= 448.0f)) continue;
    const float r = v41q::recip_e4m3(sv);
    for (int k = -16; k <= 16; ++k) {
      const float r0 = quant::bits_float(quant::float_bits(r) + static_cast<uint32_t>(k));
      if (quant::float_bits(v41q::recip_refine(sv, r0)) != quant::float_bits(r) && ++recip_bad <= 4) {
        std::printf("recip_refine s=%a r0=%a\n", sv, r0);
      }
    }
    for (uint32_t h = 0; h < 65536u; ++h) {
      const uint32_t ub = h << 16;
      if (quant::is_nan_bits(ub) && (ub >> 31)) continue;
      const float u = quant::bits_float(ub);
      ++grid_checked;
      if (v41q::fp4_code_fast3(u, sv, r) != v41q::fp4_code(u, sv, r) && ++grid_bad <= 4) {
        std::printf("fp4_code_fast3 u=%08x s=%a\n", ub, sv);
      }
      if (quant::float_bits(v41q::fake_quant_grid_fast3(u, sv, r)) !=
              quant::float_bits(v41q::fake_quant_grid(u, sv, r)) &&
          ++grid_bad <= 4) {
        std::printf("fake_quant_grid_fast3 u=%08x s=%a\n", ub, sv);
      }
    }
  }
  std::printf("recip_bad %lld grid_checked %lld grid_bad %lld\n", recip_bad, grid_checked, grid_bad);
  const float e_dev = static_cast<float>(exp_libdevice_small(-104.0)), e_glibc = static_cast<float>(std::exp(-104.0));
  const bool clamp_ok = quant::float_bits(e_dev) == 0u && quant::float_bits(e_glibc) == 0u;
  std::printf("value_bad %lld clamp_ok %d\n", value_bad, clamp_ok ? 1 : 0);
  return (value_bad || recip_bad || grid_bad || !clamp_ok) ? 1 : 0;
}
