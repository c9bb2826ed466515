// flashcompress: the scalar encoders of the store step (spec store-and-jit.md §4.3), exact in
// software and usable from host and device code.
//
//   bf16_bits(x)       fp32 -> bf16 bit pattern, round-to-nearest-even; NaN -> 0x7FFF
//   bf16_round(x)      float(bf16(x))
//   bf16_to_float(b)   bf16 bit pattern -> fp32 (exact)
//   bf16x2_bits(l, h)  bf16_bits(l) | bf16_bits(h) << 16 (bf16x2_lo / _hi: the rounded values)
//   clip448(x)         fmaxf(fminf(x, 448), -448): NaN -> +448, +-inf -> +-448
//   e4m3_code(x)       OCP E4M3FN code, RNE, saturate-to-finite; NaN -> 0x7F; sign kept
//                      (-0 and negatives that round to zero give 0x80)
//   pack_fp8(x)        e4m3_code(clip448(x))  (NaN -> 0x7E)
//   e2m1_threshold(x)  indexer FP4 magnitude code = number of thresholds {0.25, 0.75, 1.25,
//                      1.75, 2.5, 3.5, 5} that min(|x|, 6) strictly exceeds (NaN -> 7), sign bit
//                      0x8 iff x < 0 and the magnitude code is non-zero
//   ue8m0_ceil(x)      x > 0 normal: biased exponent of the smallest power of two >= x
//   inv_ue8m0(e)       fp32 2^(127 - e) from its bit pattern (254 - e) << 23 (1 <= e <= 253)
//   div_rn(a, b)       IEEE fp32 a / b, also under -use_fast_math
//
// Self-contained on purpose: no cuda_bf16.h / cuda_fp8.h (HIP 5.2 lacks hip_bf16.h and
// hip_fp8.h), only bit manipulation and C math functions whose semantics are fixed by C99
// (fminf, fmaxf, fabsf, rintf under the default rounding mode). The hardware shortcuts are
// pack_fp8x4 on sm_89+ (cvt.rn.satfinite.e4m3x2.f32 after one fminf, bit-identical to the
// software path for every input), and bf16_bits / bf16x2_bits on sm_80+ (cvt.rn.bf16.f32,
// cvt.rn.bf16x2.f32: the same semantics for every input); define
// FC_QUANT_SOFTWARE_ONLY to compile them out. The reference for every function is
// python/flashcompress/torch_backend/quant.py; tests/test_store_kernel_host.py checks the
// software paths bit for bit on the host over a dense grid of fp32 patterns, and
// tests/test_gpu_store.py the device encoders (hardware paths included) on a GPU.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__HIPCC__)
// hip-clang predefines __host__ / __device__ but neither __forceinline__ nor a device memcpy
// (hip_runtime.h adds them): this header compiles for HIP without any HIP header.
#define FC_QUANT_FN __host__ __device__ inline __attribute__((always_inline))
#define FC_QUANT_MEMCPY __builtin_memcpy
#elif defined(__CUDACC__)
#define FC_QUANT_FN __host__ __device__ __forceinline__
#else
#define FC_QUANT_FN inline
#endif
#if !defined(FC_QUANT_MEMCPY)
#define FC_QUANT_MEMCPY std::memcpy
#endif

// 1 iff pack_fp8x4 uses the sm_89+ hardware conversion in this compilation pass. Never on HIP
// (hip-clang defines no __CUDA_ARCH__): AMD device code takes the software path of every
// function here, the one the host tests check (OCP e4m3 bytes on every GPU, also on the
// FNUZ-native gfx942; tests/test_hip_build.py static_asserts this for each HIP target).
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 890) && !defined(FC_QUANT_SOFTWARE_ONLY)
#define FC_QUANT_HW_E4M3 1
#else
#define FC_QUANT_HW_E4M3 0
#endif
// 1 iff bf16_bits uses the sm_80+ conversion cvt.rn.bf16.f32 (RNE, subnormals kept, overflow to
// inf, every NaN to the canonical 0x7FFF: the software path's semantics).
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800) && !defined(FC_QUANT_SOFTWARE_ONLY)
#define FC_QUANT_HW_BF16 1
#else
#define FC_QUANT_HW_BF16 0
#endif

namespace flashcompress {
namespace quant {

inline constexpr float kE4m3Max = 448.0f;
inline constexpr float kE2m1Max = 6.0f;
inline constexpr uint32_t kE4m3MaxCode = 0x7E;
inline constexpr uint32_t kE4m3NanCode = 0x7F;
inline constexpr uint16_t kBf16CanonicalNan = 0x7FFF;

FC_QUANT_FN uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t b;
  FC_QUANT_MEMCPY(&b, &x, sizeof(b));
  return b;
#endif
}

FC_QUANT_FN float bits_float(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  FC_QUANT_MEMCPY(&x, &b, sizeof(x));
  return x;
#endif
}

FC_QUANT_FN bool is_nan_bits(uint32_t b) { return (b & 0x7FFFFFFFu) > 0x7F800000u; }

// IEEE-correct division even when the TU is built with fast math.
FC_QUANT_FN float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// ---------------------------------------------------------------------------------- bf16

FC_QUANT_FN uint16_t bf16_bits(float x) {
#if FC_QUANT_HW_BF16
  uint16_t r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
  return r;
#else
  const uint32_t b = float_bits(x);
  if (is_nan_bits(b)) return kBf16CanonicalNan;
  // RNE on the 16 dropped bits; a carry ripples into the exponent (up to inf), as it should.
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
#endif
}

FC_QUANT_FN float bf16_to_float(uint16_t bits) { return bits_float(static_cast<uint32_t>(bits) << 16); }

FC_QUANT_FN float bf16_round(float x) { return bf16_to_float(bf16_bits(x)); }

// bf16_bits(lo) | bf16_bits(hi) << 16: one cvt.rn.bf16x2.f32 for two values on sm_80+.
FC_QUANT_FN uint32_t bf16x2_bits(float lo, float hi) {
#if FC_QUANT_HW_BF16
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));  // first source -> upper half
  return r;
#else
  return static_cast<uint32_t>(bf16_bits(lo)) | (static_cast<uint32_t>(bf16_bits(hi)) << 16);
#endif
}

// bf16_round of the two values packed by bf16x2_bits.
FC_QUANT_FN float bf16x2_lo(uint32_t p) { return bits_float(p << 16); }
FC_QUANT_FN float bf16x2_hi(uint32_t p) { return bits_float(p & 0xFFFF0000u); }

// ---------------------------------------------------------------------------------- e4m3

// NaN is tested explicitly: C fminf returns NaN for a signalling NaN on glibc (IEEE minNum),
// while the spec (CUDA fminf) maps every NaN to the other operand.
FC_QUANT_FN float clip448(float x) {
  return is_nan_bits(float_bits(x)) ? kE4m3Max : fmaxf(fminf(x, kE4m3Max), -kE4m3Max);
}

// OCP E4M3FN, RNE, satfinite (cvt.rn.satfinite.e4m3x2.f32 semantics), software.
FC_QUANT_FN uint32_t e4m3_code(float x) {
  const uint32_t b = float_bits(x);
  if (is_nan_bits(b)) return kE4m3NanCode;
  const uint32_t sign = (b >> 24) & 0x80u;
  const uint32_t mag = b & 0x7FFFFFFFu;
  uint32_t code;
  if (mag < 0x3C800000u) {
    // |x| < 2^-6: e4m3 subnormals are multiples of 2^-9; |x| * 2^9 is exact and < 8, and
    // rintf rounds half to even (code 8 = 2^-6 is also the right normal code).
    code = static_cast<uint32_t>(rintf(bits_float(mag) * 512.0f));
  } else {
    // Normal range: keep 3 of the 23 mantissa bits with RNE; a carry ripples into the
    // exponent field. Rebias 127 -> 7 (subtract 120 << 3).
    code = ((mag + 0x7FFFFu + ((mag >> 20) & 1u)) >> 20) - (120u << 3);
    if (code > kE4m3MaxCode) code = kE4m3MaxCode;  // satfinite (also +-inf)
  }
  return code | sign;
}

FC_QUANT_FN uint32_t pack_fp8(float x) { return e4m3_code(clip448(x)); }

// Four pack_fp8 codes, the first value in the lowest byte.
FC_QUANT_FN uint32_t pack_fp8x4(float a, float b, float c, float d) {
#if FC_QUANT_HW_E4M3
  // cvt packs its first source operand into the upper byte. clip448 in one instruction: the
  // device fminf (FMNMX) maps every NaN, quiet or signalling, to 448 and +inf to 448, and
  // satfinite clamps what is left below -448 (-inf included) to -448, as clip448 would.
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(fminf(b, kE4m3Max)), "f"(fminf(a, kE4m3Max)));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(fminf(d, kE4m3Max)), "f"(fminf(c, kE4m3Max)));
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
#else
  return pack_fp8(a) | (pack_fp8(b) << 8) | (pack_fp8(c) << 16) | (pack_fp8(d) << 24);
#endif
}

// ---------------------------------------------------------------------------------- e2m1

FC_QUANT_FN uint32_t e2m1_threshold(float x) {
  const float a = is_nan_bits(float_bits(x)) ? kE2m1Max : fminf(fabsf(x), kE2m1Max);  // NaN -> 6
  const uint32_t mag = static_cast<uint32_t>(a > 0.25f) + static_cast<uint32_t>(a > 0.75f) +
                       static_cast<uint32_t>(a > 1.25f) + static_cast<uint32_t>(a > 1.75f) +
                       static_cast<uint32_t>(a > 2.5f) + static_cast<uint32_t>(a > 3.5f) +
                       static_cast<uint32_t>(a > 5.0f);
  return mag | ((x < 0.0f && mag != 0) ? 0x8u : 0x0u);
}

// ---------------------------------------------------------------------------------- ue8m0

FC_QUANT_FN uint32_t ue8m0_ceil(float x) {
  const uint32_t b = float_bits(x);
  return ((b >> 23) & 0xFFu) + ((b & 0x7FFFFFu) != 0 ? 1u : 0u);
}

FC_QUANT_FN float inv_ue8m0(uint32_t e) { return bits_float((254u - e) << 23); }

}  // namespace quant
}  // namespace flashcompress
