// flashcompress: the row helpers shared by the v41 kernel designs (v41.cuh, v41_fast.cuh): the
// family's constants, 16-byte row loads / stores, the RMSNorm in the reference's order, RoPE,
// and the quantised encoders of every layout (`kFast` picks the division-free arithmetic of
// v41_quant.cuh). Thread mapping, reference order and arithmetic: the comment of v41.cuh.
#pragma once

#include <cstdint>

#include "arch.cuh"
#include "gpu_runtime.h"
#include "quant.cuh"
#include "v41_fast3_math.cuh"
#include "v41_launch.h"
#include "v41_quant.cuh"

namespace flashcompress {
namespace v41 {

inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kDim = 512;
inline constexpr int kStateWidth = 2 * kDim;
inline constexpr int kIndexDim = 128;
inline constexpr int kIndexRowsPerBlock = kThreads / 16;
inline constexpr float kInvSix = 0.16666667f;       // fp32(1/6)
inline constexpr float kScaleMin = 0.001953125f;     // 2^-9
inline constexpr float kAmaxFloor = 1e-4f;
inline constexpr float kStage1Floor = 6.0f * 1.17549435e-38f;  // 6 * 2^-126 (exact)
inline constexpr uint32_t kV41MinExponent = 114;
template <V41Layout kLayout>
struct LayoutTraits {
  static constexpr bool kFp4 = kLayout == V41Layout::kV41Fp4 || kLayout == V41Layout::kV41Fp4New;
  static constexpr bool kFp8Tiles = kLayout == V41Layout::kV41 || kLayout == V41Layout::kV41New;
};

// ------------------------------------------------------------------ small helpers

__device__ __forceinline__ int64_t load_index(const void* p, bool i64, int64_t i) {
  return i64 ? static_cast<const int64_t*>(p)[i] : static_cast<int64_t>(static_cast<const int32_t*>(p)[i]);
}

__device__ __forceinline__ void load_bf16x8(const uint16_t* p, float (&x)[8]) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = quant::bits_float(w[i] << 16);
    x[2 * i + 1] = quant::bits_float(w[i] & 0xFFFF0000u);
  }
}

__device__ __forceinline__ void store_bf16x8(uint16_t* p, const float (&x)[8]) {
  uint4 v;
  v.x = quant::bf16x2_bits(x[0], x[1]);
  v.y = quant::bf16x2_bits(x[2], x[3]);
  v.z = quant::bf16x2_bits(x[4], x[5]);
  v.w = quant::bf16x2_bits(x[6], x[7]);
  *reinterpret_cast<uint4*>(p) = v;
}

__device__ __forceinline__ void load_f32x8(const float* p, float (&x)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}

__device__ __forceinline__ void store_f32x8(float* p, const float (&x)[8]) {
  *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
  *reinterpret_cast<float4*>(p + 4) = make_float4(x[4], x[5], x[6], x[7]);
}

__device__ __forceinline__ float abs_max8(const float (&x)[8]) {
  float a = 0.0f;  // fmaxf from 0 ignores NaN, like the reference's amax
#pragma unroll
  for (int j = 0; j < 8; ++j) a = fmaxf(a, fabsf(x[j]));
  return a;
}

template <int kWidth>
__device__ __forceinline__ float lanes_max(float v) {
#pragma unroll
  for (int m = 1; m < kWidth; m <<= 1) v = fmaxf(v, shfl_xor(v, m, 32));
  return v;
}

// nf = fp32(1 / sqrt(fp64(ss * 2^-k + eps))) for D = 2^k.
template <int kD>
__device__ __forceinline__ float norm_factor(float ss, float eps) {
  const float mean = __fadd_rn(__fmul_rn(ss, 1.0f / kD), eps);
  return static_cast<float>(1.0 / sqrt(static_cast<double>(mean)));
}

// RoPE of 4 interleaved (re, im) pairs with their 8 (cos, sin) table values, bf16-rounded.
__device__ __forceinline__ void rope8(float (&x)[8], const float (&cs)[8]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float re = x[2 * q], im = x[2 * q + 1], c = cs[2 * q], s = cs[2 * q + 1];
    x[2 * q] = quant::bf16_round(__fmaf_rn(re, c, -__fmul_rn(im, s)));
    x[2 * q + 1] = quant::bf16_round(__fmaf_rn(re, s, __fmul_rn(im, c)));
  }
}

// ------------------------------------------------------------------ 512-dim rows (c1, c2)

// One torch warp's partial sum of squares (see the file comment): this lane's 4 torch lanes,
// butterflies 16 / 8 / 4 as lane xors 4 / 2 / 1, then offsets 2 and 1 in the lane.
__device__ __forceinline__ float torch_warp_partial(const float (&x)[8]) {
  float t[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) t[i] = __fadd_rn(__fmul_rn(x[2 * i], x[2 * i]), __fmul_rn(x[2 * i + 1], x[2 * i + 1]));
#pragma unroll
  for (int m = 4; m >= 1; m >>= 1) {
#pragma unroll
    for (int i = 0; i < 4; ++i) t[i] = __fadd_rn(t[i], shfl_xor(t[i], m, 32));
  }
  return __fadd_rn(__fadd_rn(t[0], t[2]), __fadd_rn(t[1], t[3]));
}

__device__ __forceinline__ void load_weight(const uint16_t* weight, int lane, float (&w)[2][8]) {
  load_bf16x8(weight + 8 * lane, w[0]);
  load_bf16x8(weight + 256 + 8 * lane, w[1]);
}

// The RMSNorm factor nf of a 512-dim row held as x[h][j] = dim 256 h + 8 lane + j (every lane).
__device__ __forceinline__ float row_norm_factor(const float (&x)[2][8], float eps) {
  const float p0 = torch_warp_partial(x[0]), p1 = torch_warp_partial(x[1]);
  float ss = shfl_idx(p0, 0, 32);
#pragma unroll
  for (int k = 1; k < 4; ++k) ss = __fadd_rn(ss, shfl_idx(p0, 8 * k, 32));
#pragma unroll
  for (int k = 0; k < 4; ++k) ss = __fadd_rn(ss, shfl_idx(p1, 8 * k, 32));
  return norm_factor<kDim>(ss, eps);
}

// latent = bf16((x * nf) * w) of a 512-dim row held as x[h][j] = dim 256 h + 8 lane + j (w likewise).
__device__ __forceinline__ void rms_norm_row(float (&x)[2][8], const float (&w)[2][8], float eps) {
  const float nf = row_norm_factor(x, eps);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int j = 0; j < 8; ++j) x[h][j] = quant::bf16_round(__fmul_rn(__fmul_rn(x[h][j], nf), w[h][j]));
  }
}

__device__ __forceinline__ void rms_norm_row(float (&x)[2][8], const uint16_t* weight, float eps, int lane) {
  float w[2][8];
  load_weight(weight, lane, w);
  rms_norm_row(x, w, eps);
}

struct Slot {
  uint8_t* data;
  uint8_t* scales;
};

__device__ __forceinline__ Slot slot_at(const V41Paging& p, int64_t loc) {
  const int64_t page = loc >> p.page_shift;
  const int64_t s = loc & ((int64_t{1} << p.page_shift) - 1);
  uint8_t* base = p.cache + page * p.page_bytes;
  return {base + s * p.data_stride, base + p.scale_base + s * p.scale_stride};
}

// The per-16 e4m3 scale of a 2-lane block: e4m3(clamp(raw, 2^-9, 448)), code and value.
__device__ __forceinline__ uint32_t kv_scale_code(float raw) {
  return quant::e4m3_code(fminf(fmaxf(raw, kScaleMin), quant::kE4m3Max));
}

// kv_scale_code and the code's value: the software encoder and decoder, or (kHw, design fast3)
// the hardware conversion and the exact bit placement of v41_fast3_math.cuh (the same code and
// value for every raw).
template <bool kHw>
__device__ __forceinline__ uint32_t kv_scale_code_as(float raw) {
  if constexpr (kHw) return v41q::scale_code_hw(raw);
  return kv_scale_code(raw);
}

template <bool kHw>
__device__ __forceinline__ float kv_scale_value(uint32_t code) {
  if constexpr (kHw) return v41q::e4m3_value_pos(code);
  return v41q::e4m3_value(code);
}

// u / s for a bf16-exact u and an e4m3 scale s in [2^-9, 448] (r = rn(1 / s)): the IEEE division
// (base design) or v41q::div_by (fast design: two FMAs, the same e2m1 code for every such pair).
template <bool kFast>
__device__ __forceinline__ float scale_quotient(float u, float s, float r) {
  if constexpr (kFast) {
    return v41q::div_by(u, s, r);
  } else {
    (void)r;
    return __fdiv_rn(u, s);
  }
}

template <bool kFast>
__device__ __forceinline__ float scale_recip(float s) {
  if constexpr (kFast) {
    return v41q::recip_e4m3(s);
  } else {
    (void)s;
    return 0.0f;
  }
}

// Design fast3: fake_quant_half's grid values g into u (the fake-quant values are g s, each exact:
// g has 2 significant bits, s 4, |g s| in [2^-10, 2688] or 0); returns the block scale s.
__device__ __forceinline__ float fake_quant_grid_half(float (&u)[8]) {
  const float amax = lanes_max<2>(abs_max8(u));
  const float s = kv_scale_value<true>(kv_scale_code_as<true>(__fmul_rn(amax, kInvSix)));
  const float r = recip_e4m3_fast3(s);
#pragma unroll
  for (int j = 0; j < 8; ++j) u[j] = v41q::fake_quant_grid_fast3(u[j], s, r);
  return s;
}

// Fake quantisation (spec §2.2) of one half row u (dims 256 h + 8 lane + j), in place:
// q = e2m1(u / S + 0) * S, S per 16 dims (2 lanes). kHw: design fast3's arithmetic.
template <bool kFast, bool kHw = false>
__device__ __forceinline__ void fake_quant_half(float (&u)[8]) {
  if constexpr (kHw) {
    const float s = fake_quant_grid_half(u);
#pragma unroll
    for (int j = 0; j < 8; ++j) u[j] = __fmul_rn(u[j], s);
    return;
  }
  const float amax = lanes_max<2>(abs_max8(u));
  const float s = v41q::e4m3_value(kv_scale_code(__fmul_rn(amax, kInvSix)));
  const float r = scale_recip<kFast>(s);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float grid;
    if constexpr (kFast) {
      grid = v41q::fake_quant_grid(u[j], s, r);
    } else {
      grid = v41q::e2m1_value(v41q::e2m1_rne(__fadd_rn(__fdiv_rn(u[j], s), 0.0f)));
    }
    u[j] = __fmul_rn(grid, s);
  }
}

// kNoNan (design fast3): x * inv is never NaN (fake-quant values), so v41q::pack_fp8x4_no_nan.
template <bool kNoNan = false>
__device__ __forceinline__ uint64_t fp8x8(const float (&x)[8], float inv) {
  const auto pack = [](float a, float b, float c, float d) {
    return kNoNan ? v41q::pack_fp8x4_no_nan(a, b, c, d) : quant::pack_fp8x4(a, b, c, d);
  };
  const uint32_t lo = pack(__fmul_rn(x[0], inv), __fmul_rn(x[1], inv), __fmul_rn(x[2], inv), __fmul_rn(x[3], inv));
  const uint32_t hi = pack(__fmul_rn(x[4], inv), __fmul_rn(x[5], inv), __fmul_rn(x[6], inv), __fmul_rn(x[7], inv));
  return static_cast<uint64_t>(lo) | (static_cast<uint64_t>(hi) << 32);
}

// Encode and store half h of the rotated row (u: dims 256 h + 8 lane + j; fp4 layouts) or of its
// fake-quantised q (the others) at `slot`. Every lane of the warp must call it (the scale
// reductions shuffle). kHw (design fast3): the scale bytes by kv_scale_code_as<true>, their
// reciprocals by recip_e4m3_fast3, the fake-quant grid and fp4 codes by v41q::*_fast3.
template <V41Layout kLayout, bool kFast, bool kHw = false>
__device__ __forceinline__ void encode_half(float (&u)[8], int h, const Slot& slot, int lane) {
  using T = LayoutTraits<kLayout>;
  if constexpr (T::kFp4) {
    const float amax = lanes_max<2>(abs_max8(u));  // bf16-exact, as u
    const uint32_t code =
        kv_scale_code_as<kHw>(scale_quotient<kFast>(amax, quant::kE2m1Max, scale_recip<kFast>(quant::kE2m1Max)));
    const float s = kv_scale_value<kHw>(code);
    const float r = kHw ? recip_e4m3_fast3(s) : scale_recip<kFast>(s);
    uint32_t word = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t c = kHw ? v41q::fp4_code_fast3(u[j], s, r)
                             : (kFast ? v41q::fp4_code(u[j], s, r) : v41q::e2m1_rne(__fdiv_rn(u[j], s)));
      word |= c << (4 * j);
    }
    *reinterpret_cast<uint32_t*>(slot.data + 128 * h + 4 * lane) = word;
    // block 16 h + lane / 2; lanes 8 g gather the four blocks of their 8-lane group
    const uint32_t c2 = shfl_idx(code, (lane + 2) & 31, 32), c4 = shfl_idx(code, (lane + 4) & 31, 32),
                   c6 = shfl_idx(code, (lane + 6) & 31, 32);
    if ((lane & 7) == 0) {
      *reinterpret_cast<uint32_t*>(slot.scales + 16 * h + lane / 2) = code | (c2 << 8) | (c4 << 16) | (c6 << 24);
    }
  } else {
    // kGrid (fast3, tile layouts): u keeps the grid values g and qs their scale s (the fake-quant
    // values are g s): the lane's max |g s| is s max |g| (s > 0, exact products) and the fp8
    // operand g s 2^-k is g (s 2^-k) (s 2^-k and g s 2^-k are normal for every scale of these
    // layouts: exact), one multiply per value instead of two. Otherwise u holds g s.
    constexpr bool kGrid = kHw && kLayout != V41Layout::kUniformFp8;
    float qs = 1.0f;
    if constexpr (kGrid) {
      qs = fake_quant_grid_half(u);
    } else {
      fake_quant_half<kFast, kHw>(u);
    }
    const float lane_max = kGrid ? __fmul_rn(abs_max8(u), qs) : abs_max8(u);
    const auto fp8_scale = [qs](float inv) { return kGrid ? __fmul_rn(qs, inv) : inv; };
    if constexpr (T::kFp8Tiles) {
      const uint32_t bits = quant::float_bits(lanes_max<4>(lane_max));
      int32_t e = static_cast<int32_t>(bits >> 23) - 8 + ((bits & 0x7FFFFFu) > 0x600000u ? 1 : 0);
      e = e < static_cast<int32_t>(kV41MinExponent) ? static_cast<int32_t>(kV41MinExponent) : e;
      const uint32_t ue = static_cast<uint32_t>(e);
      *reinterpret_cast<uint64_t*>(slot.data + 256 * h + 8 * lane) = fp8x8<kHw>(u, fp8_scale(quant::inv_ue8m0(ue)));
      // tile 8 h + lane / 4; lanes 16 g gather four tiles
      const uint32_t e4 = shfl_idx(ue, (lane + 4) & 31, 32), e8 = shfl_idx(ue, (lane + 8) & 31, 32),
                     e12 = shfl_idx(ue, (lane + 12) & 31, 32);
      if ((lane & 15) == 0) {
        *reinterpret_cast<uint32_t*>(slot.scales + 8 * h + lane / 4) = ue | (e4 << 8) | (e8 << 16) | (e12 << 24);
      }
    } else if constexpr (kLayout == V41Layout::kUniformFp8) {
      *reinterpret_cast<uint64_t*>(slot.data + 256 * h + 8 * lane) = fp8x8<kHw>(u, 1.0f);
    } else {  // V4: 7 tiles of 64 e4m3 + 64 bf16 RoPE dims; scale byte 7 untouched
      // amax: a fake-quant value (bf16-exact, >= 2^-10 when not 0) or the floor 1e-4f, so the
      // fast design's division is exact (host check)
      const float amax = fmaxf(lanes_max<8>(lane_max), kAmaxFloor);
      const uint32_t ue = quant::ue8m0_ceil(
          scale_quotient<kFast>(amax, quant::kE4m3Max, scale_recip<kFast>(quant::kE4m3Max)));
      const bool rope = h == 1 && lane >= 24;
      if (!rope) {
        *reinterpret_cast<uint64_t*>(slot.data + 256 * h + 8 * lane) = fp8x8<kHw>(u, fp8_scale(quant::inv_ue8m0(ue)));
        if ((lane & 7) == 0) slot.scales[4 * h + lane / 8] = static_cast<uint8_t>(ue);
      } else {
        const auto q = [&u, qs](int j) { return kGrid ? __fmul_rn(u[j], qs) : u[j]; };
        uint4 v;
        v.x = quant::bf16x2_bits(q(0), q(1));
        v.y = quant::bf16x2_bits(q(2), q(3));
        v.z = quant::bf16x2_bits(q(4), q(5));
        v.w = quant::bf16x2_bits(q(6), q(7));
        *reinterpret_cast<uint4*>(slot.data + 448 + 16 * (lane - 24)) = v;
      }
    }
  }
}

// The whole row (both halves).
template <V41Layout kLayout, bool kFast>
__device__ __forceinline__ void encode_store(float (&u)[2][8], const Slot& slot, int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) encode_half<kLayout, kFast>(u[h], h, slot, lane);
}

// kv and score halves of an fp32 [1024] row: kv[h][j] = dim 256 h + 8 lane + j, score likewise.
__device__ __forceinline__ void load_pair_row(const float* p, int lane, float (&kv)[2][8], float (&sc)[2][8]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    load_f32x8(p + 256 * h + 8 * lane, kv[h]);
    load_f32x8(p + kDim + 256 * h + 8 * lane, sc[h]);
  }
}

__device__ __forceinline__ void copy_pair_row(float* dst, const float* src, int lane) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int off = 128 * k + 4 * lane;
    *reinterpret_cast<float4*>(dst + off) = *reinterpret_cast<const float4*>(src + off);
  }
}

// The odd row (k1, s1) pools with its partner (k0, s0) in place into k1, bf16-rounded.
__device__ __forceinline__ void pool_pair(float (&k1)[2][8], const float (&s1)[2][8], const float (&k0)[2][8],
                                          const float (&s0)[2][8]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float d = __fsub_rn(s0[h][j], s1[h][j]);
      const float e = static_cast<float>(exp(-static_cast<double>(fabsf(d))));
      const bool first = d > 0.0f;
      const float a0 = first ? 1.0f : e, a1 = first ? e : 1.0f;
      const float num = __fmaf_rn(k0[h][j], a0, __fmul_rn(k1[h][j], a1));
      k1[h][j] = quant::bf16_round(__fdiv_rn(num, __fadd_rn(1.0f, e)));
    }
  }
}

__device__ __forceinline__ int64_t ring_row(int64_t rid, int64_t pos, int64_t back, int64_t ring) {
  int64_t w = (pos - back) % ring;
  return rid * ring + (w < 0 ? w + ring : w);
}

}  // namespace v41
}  // namespace flashcompress
