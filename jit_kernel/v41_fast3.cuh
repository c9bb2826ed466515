// flashcompress: the row arithmetic of the v41 design "fast3" (kFast3), the same bytes as the
// other designs. The fast kernels of v41_fast.cuh take the design as a template parameter and
// call these helpers (and the kHw paths of v41_common.cuh's encoders) for kFast3; launch shapes,
// load order and the decode-sized split kernels are fast2's. Row mapping as v41.cuh: lane L holds
// dims 256 h + 8 L + j of a 512-dim row. Scalar primitives and their host checks:
// v41_fast3_math.cuh.
//
// What fast3 changes, per lane and row (c1; c2: the same after the pooling):
//   * the latent bf16((x nf) w) is rounded two values at a time (cvt.rn.bf16x2.f32, the same RNE
//     as two cvt.rn.bf16.f32) into the words that the latent store writes as they are: no
//     second conversion for the store, one unpack per value for RoPE and the encoders;
//   * RoPE's bf16 outputs likewise, per (re, im) pair;
//   * scales: the fp4 / fake-quant e4m3 byte by one hardware conversion, its value by an exact bit
//     placement and multiply, its reciprocal by rcp.approx and one Newton step (no select tree);
//   * the e2m1 grid: the rounding constant from max(|q|, 1) 2^22 masked to a power of two, the
//     fake-quant sign copied by one bit operation, the fp4 code read off the grid value's bits;
//   * fp8 tile layouts: the fp8 operand as grid value times (scale 2^-k), one multiply per value;
//     the packs without the NaN clamp (their operands are never NaN), joined by one mov;
//   * c2 pool: the pair weight's |d| >= 104 / NaN cases by a clamp and one max.NaN (exp(-104)
//     rounds to +0 in fp32) instead of selects, the exp constants from the constant bank, the
//     quotient's range check by two magnitude compares, the pooled bf16 roundings two at a time,
//     the norm weight loaded after the pooling.
#pragma once

#include <cstdint>

#include "arch.cuh"
#include "gpu_runtime.h"
#include "quant.cuh"
#include "v41_common.cuh"
#include "v41_fast3_math.cuh"
#include "v41_launch.h"

namespace flashcompress {
namespace v41 {

// Latent of a 512-dim row as bf16x2 words: p[h][i] holds dims 256 h + 8 lane + 2 i (low half)
// and + 1 (high half); x gets the same values as fp32 (rms_norm_row's result).
__device__ __forceinline__ void rms_norm_row_words(float (&x)[2][8], const float (&w)[2][8], float eps,
                                                   uint32_t (&p)[2][4]) {
  const float nf = row_norm_factor(x, eps);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      p[h][i] = quant::bf16x2_bits(__fmul_rn(__fmul_rn(x[h][2 * i], nf), w[h][2 * i]),
                                   __fmul_rn(__fmul_rn(x[h][2 * i + 1], nf), w[h][2 * i + 1]));
      x[h][2 * i] = quant::bf16x2_lo(p[h][i]);
      x[h][2 * i + 1] = quant::bf16x2_hi(p[h][i]);
    }
  }
}

__device__ __forceinline__ void store_words(uint16_t* dst, const uint32_t (&p)[4]) {
  *reinterpret_cast<uint4*>(dst) = make_uint4(p[0], p[1], p[2], p[3]);
}

// rope8 with each (re', im') pair rounded by one bf16x2 conversion.
__device__ __forceinline__ void rope8_pairs(float (&x)[8], const float (&cs)[8]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float re = x[2 * q], im = x[2 * q + 1], c = cs[2 * q], s = cs[2 * q + 1];
    const uint32_t w = quant::bf16x2_bits(__fmaf_rn(re, c, -__fmul_rn(im, s)), __fmaf_rn(re, s, __fmul_rn(im, c)));
    x[2 * q] = quant::bf16x2_lo(w);
    x[2 * q + 1] = quant::bf16x2_hi(w);
  }
}

// Fast3 of rms_norm_row + finish_row_loaded: norm into words, publish them, RoPE (lanes 24..31,
// half 1), encode and store at `loc` (loc < 0: none).
template <V41Layout kLayout>
__device__ __forceinline__ void norm_finish_fast3(float (&x)[2][8], const float (&w)[2][8], const float (&cs)[8],
                                                  const V41Args& a, int64_t row, int64_t loc, int lane) {
  uint32_t p[2][4];
  rms_norm_row_words(x, w, a.eps, p);
  uint16_t* out = a.out + row * kDim + 8 * lane;
  store_words(out, p[0]);
  store_words(out + 256, p[1]);
  if (loc < 0) return;  // warp-uniform
  if (lane >= 24) rope8_pairs(x[1], cs);
  const Slot slot = slot_at(a.paging, loc);
#pragma unroll
  for (int h = 0; h < 2; ++h) encode_half<kLayout, true, true>(x[h], h, slot, lane);
}

}  // namespace v41
}  // namespace flashcompress
