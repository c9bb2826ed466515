// Host check of v41q::recip_e4m3 / v41q::div_by (jit_kernel/v41_quant.cuh): for every bf16 bit
// pattern u and every e4m3 code whose value s lies in [2^-9, 448], compares div_by(u, s,
// recip_e4m3(s)) with the IEEE quotient u / s: bit for bit for |u| >= 2^-122 (NaN: any NaN; the
// kernels' e2m1 code of a NaN does not depend on its payload), and by e2m1_rne code (sign
// included: the only use of a quotient) for every u; recip_e4m3(s) with 1 / s bit for bit.
// Prints the counts; exits 1 on any mismatch (tests/test_v41_kernel_build.py).
#include <cstdint>
#include <cstdio>

#include "v41_quant.cuh"

using namespace flashcompress;

int main() {
  long long checked = 0, bad_q = 0, bad_r = 0, bad_code = 0, bad_fq = 0, bad_fp4 = 0;
  uint32_t worst = 0;
  for (uint32_t code = 1; code <= 0x7Eu; ++code) {
    const float s = v41q::e4m3_value(code);
    if (!(s >= 0.001953125f && s <= 448.0f)) continue;
    const float r = v41q::recip_e4m3(s);
    const volatile float one = 1.0f;
    if (quant::float_bits(r) != quant::float_bits(one / s)) {
      if (++bad_r <= 4) std::printf("recip mismatch code %u\n", code);
    }
    for (uint32_t h = 0; h < 65536u; ++h) {
      const float u = quant::bits_float(h << 16);
      const volatile float uv = u;
      const float want = uv / s;
      const float got = v41q::div_by(u, s, r);
      const uint32_t wb = quant::float_bits(want), gb = quant::float_bits(got);
      const bool same = wb == gb || (quant::is_nan_bits(wb) && quant::is_nan_bits(gb));
      ++checked;
      if (!same) {  // the largest |u| of a bit mismatch, and whether the e2m1 code differs
        const uint32_t mag = (h << 16) & 0x7FFFFFFFu;
        if (mag > worst) worst = mag;
        if (v41q::e2m1_rne(want) != v41q::e2m1_rne(got)) ++bad_code;
      }
      bad_q += !same;
      if (v41q::fp4_code(u, s, r) != v41q::e2m1_rne(want)) {
        if (++bad_fp4 <= 4) std::printf("fp4_code u=%08x s=%a\n", h << 16, s);
      }
      const float fq_want = v41q::e2m1_value(v41q::e2m1_rne(want + 0.0f));
      if (quant::float_bits(v41q::fake_quant_grid(u, s, r)) != quant::float_bits(fq_want)) {
        if (++bad_fq <= 4) std::printf("fake_quant_grid u=%08x s=%a\n", h << 16, s);
      }
    }
  }
  std::printf("fake_quant_grid_bad %lld fp4_code_bad %lld\n", bad_fq, bad_fp4);
  // the V4 tile scale divides max(amax, 1e-4f) by 448: the floor is the one non-bf16 numerator
  const volatile float floor_v = 1e-4f;
  const bool floor_ok = quant::float_bits(v41q::div_by(1e-4f, 448.0f, v41q::recip_e4m3(448.0f))) ==
                        quant::float_bits(floor_v / 448.0f);
  std::printf("floor_ok %d\n", floor_ok ? 1 : 0);
  std::printf("checked %lld recip_bad %lld quot_bad %lld code_bad %lld largest |u| %a\n", checked, bad_r, bad_q,
              bad_code, quant::bits_float(worst));
  return (!floor_ok || bad_fq || bad_fp4 || bad_r || bad_code || worst >= 0x02800000u  /* 2^-122 */) ? 1 : 0;
}
