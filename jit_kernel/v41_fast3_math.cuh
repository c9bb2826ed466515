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
//   max_nan(a, b)      max.NaN.f32: NaN if either is NaN, else fmaxf.
// Host check of e4m3_value_pos against v41q::e4m3_value for every such code, and of the pair
// weight's clamp (fp32(exp(-104)) = +0): tests/native/v41_fast3_host.cpp.
#pragma once

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
  const float c = fminf(fmaxf(x, 0.001953125f), quant::kE4m3Max);
#if FC_QUANT_HW_E4M3
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(c));  // second source -> low byte
  return pair & 0xFFu;
#else
  return quant::e4m3_code(c);
#endif
}

}  // namespace v41q

namespace v41 {

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
