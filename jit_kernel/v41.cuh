// flashcompress: the DeepSeek-V4.1 low-ratio compressor ops (spec v41.md §3-§5, §7) as CUDA
// kernels. Device code; included by the kernel TU of the `v41` family only. The byte-exact
// reference is python/flashcompress/torch_backend/v41.py (+ v41_quant.py).
//
// Ops (V41Launch<kOp, kLayout, kDesign>::run, args in v41_launch.h; base design: grids of
// 256-thread blocks, as below; the fast design: see "Fast design" after this list):
//   kC1        c1_decode_norm_rope_store: input bf16 [N, 512]; one warp per row, 8 rows per block.
//              RMSNorm -> out[row] (every row) -> RoPE at positions[row] -> fake quant -> store at
//              out_loc[row] (rows with out_loc <= 0 store nothing).
//   kC2Decode  c2_decode_norm_rope_store: input fp32 [N, 1024] (kv | score), pair ring state fp32
//              [rows, 1024]; one warp per row. Padded rows (raw_out_loc == 0) write nothing; even
//              positions park their input row at ring row req * ring + pos % ring; odd positions
//              pool with their partner (previous input row inside a verify block of draft_len
//              rows, else ring row req * ring + (pos - 1) % ring), write out[row], RoPE at pos - 1,
//              store at raw_out_loc >> 1.
//   kC2Prefill c2_prefill_norm_rope_store: pass 1 as decode for odd, non-padded rows (partner: the
//              previous input row if same request, previous position and not padded, else the
//              ring); pass 2 (a second launch) copies the last min(len, ring) non-padded rows of
//              each request to the ring, one warp per (request, k).
//   kIndexK    index_k_norm_rope_pack_store: input bf16 [N, 128]; 16 lanes per row, 16 rows per
//              block. RMSNorm over 128, RoPE at pos & ~(ratio - 1), two fp4 stages per 32 dims,
//              68-byte slot at loc (loc <= 0: nothing).
//
// Thread mapping of a 512-dim row: lane L holds dims 256 h + 8 L + j (h = 0, 1; j = 0..7), so each
// lane moves 16-byte vectors (bf16 x 8 / fp32 x 4) and a warp's accesses coalesce. The reference's
// RMSNorm sum is the peer's 256-thread order (torch lane l of torch warp w owns dims 64 w + 2 l,
// 2 l + 1; xor butterfly 16, 8, 4, 2, 1 inside a torch warp; the 8 warp partials in order): torch
// lanes 4 (L & 7) + i of torch warp 4 h + (L >> 3) live in lane L, so butterfly offsets 16 / 8 / 4
// are lane xors 4 / 2 / 1 and offsets 2 / 1 are in-lane. The 64 RoPE dims are h = 1 of lanes
// 24..31. Quantisation blocks: 16 dims = 2 lanes (fp4 scales), 32 dims = 4 lanes (V41 fp8 tiles),
// 64 dims = 8 lanes (V4 tiles). Index-K: lane m of a 16-lane group holds dims 8 m + j; torch lane
// 4 m + i (m < 8) owns dims 8 m + 2 i, +1 and 64 + 8 m + 2 i, +1 (the partner lane m + 8).
//
// Arithmetic (fp32 unless noted; explicit _rn intrinsics where contraction would change bits):
//   nf = fp32(1 / sqrt(fp64(ss / D + eps))) (correctly rounded, as the reference);
//   latent = bf16((x * nf) * w); RoPE re' = fma(re, c, -(im s)), im' = fma(re, s, im c), bf16;
//   c2 pooling e = fp32(exp(fp64(-|s0 - s1|))), (k0 a0 + k1 a1) / (1 + e) with fma(k0, a0, k1 a1).
//
// Design fast2: fast, plus two warps per row for decode-sized c1 and c2 decode / verify launches
// (c1_split_kernel, c2_split_kernel).
// Fast design (kDesign = kFast; c1 and c2, index-K has one design), the same bytes:
//   * blocks by launch size: up to 1024 rows (c2 prefill: row pairs) one warp per block, so a
//     decode batch spreads over as many SMs as it has rows; larger launches 4 warps per block.
//   * decode-sized launches pin their first loads in program order (volatile asm: the compiler
//     would otherwise sink them behind the padded-row exit or the first shuffles): metadata, row,
//     norm weight (and a verify block's previous row) leave in one burst after the wait, then the
//     RoPE row (and c2's ring partner), which need the position: two dependent load groups.
//   * c2 prefill: one warp per row pair (2w, 2w + 1), so no warp (and block register share) is
//     spent on an even row; metadata of rows 2w - 1 .. 2w + 1 in one burst.
//   * no IEEE division on the quantisation path: u / S by v41q::recip_e4m3 + two FMAs
//     (v41q::fake_quant_grid, div_by), exhaustively equal on their whole input domain
//     (tests/native/v41_div_host.cpp); the pool division num / (1 + e) by rcp.approx + FMA
//     correction, exact after the bf16 rounding unless a few ulps from a bf16 tie (then, and for
//     numerators outside [2^-100, 2^101), the lane redoes its divisions in IEEE: pool_pair_fast).
//   * e = fp32(exp(-|d|)) by a branch-free copy of libdevice's exp(double) (exp_libdevice_small:
//     the same operations and constants, without the range branch that serialised the 16 fp64
//     chains of a lane), so the 16 channels of a lane overlap.
//
// Every kernel waits on griddepcontrol before its first global read (FC_ENABLE_PDL launches) and
// lets the next kernel of the stream launch right after that wait (its own wait still waits for
// this grid to finish). No host synchronisation; graph-capturable.
#pragma once

#include <cstdint>

#include "arch.cuh"
#include "gpu_runtime.h"
#include "launch.h"
#include "ptx.cuh"
#include "quant.cuh"
#include "v41_launch.h"
#include "v41_quant.cuh"

#ifndef FC_V41_FAST_C2_MIN_BLOCKS
#define FC_V41_FAST_C2_MIN_BLOCKS 4
#endif

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
// Fast design: at most 4 warps per block; c2 capped at 128 registers (4 such blocks per SM), which
// keeps its 16 fp64 exps per lane from taking 200+ registers.
inline constexpr int kFastMaxThreads = 128;
inline constexpr int kFastC2MinBlocks = FC_V41_FAST_C2_MIN_BLOCKS;

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

// Loads that stay where the source puts them (volatile asm: not sunk past a branch or a use), so
// that a row's independent loads leave in one burst. Plain weak global loads, as the others.
// (HIP, which the family does not build today: plain loads.)
__device__ __forceinline__ uint4 ld_u32x4_now(const void* p) {
#if FC_GPU_HIP
  return *static_cast<const uint4*>(p);
#else
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
#endif
}

__device__ __forceinline__ int64_t ld_i64_now(const int64_t* p) {
#if FC_GPU_HIP
  return *p;
#else
  int64_t v;
  asm volatile("ld.volatile.global.s64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
#endif
}

__device__ __forceinline__ int64_t ld_index_now(const void* p, bool i64, int64_t i) {
#if FC_GPU_HIP
  return load_index(p, i64, i);
#else
  if (i64) return ld_i64_now(static_cast<const int64_t*>(p) + i);
  int32_t w;
  asm volatile("ld.volatile.global.s32 %0, [%1];" : "=r"(w) : "l"(static_cast<const int32_t*>(p) + i));
  return w;
#endif
}

__device__ __forceinline__ void bf16x8_now(const uint16_t* p, float (&x)[8]) {
  const uint4 v = ld_u32x4_now(p);
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = quant::bits_float(w[i] << 16);
    x[2 * i + 1] = quant::bits_float(w[i] & 0xFFFF0000u);
  }
}

__device__ __forceinline__ void f32x8_now(const float* p, float (&x)[8]) {
  const uint4 a = ld_u32x4_now(p), b = ld_u32x4_now(p + 4);
  x[0] = __uint_as_float(a.x), x[1] = __uint_as_float(a.y), x[2] = __uint_as_float(a.z), x[3] = __uint_as_float(a.w);
  x[4] = __uint_as_float(b.x), x[5] = __uint_as_float(b.y), x[6] = __uint_as_float(b.z), x[7] = __uint_as_float(b.w);
}

// The row loads of the fast kernels: pinned in place (kEarly: decode-sized launches, where the
// round trips are the latency) or plain (wide launches, where the scheduler's choice is fine).
template <bool kEarly>
__device__ __forceinline__ int64_t ld_index(const void* p, bool i64, int64_t i) {
  if constexpr (kEarly) return ld_index_now(p, i64, i);
  return load_index(p, i64, i);
}

template <bool kEarly>
__device__ __forceinline__ int64_t ld_i64(const int64_t* p) {
  if constexpr (kEarly) return ld_i64_now(p);
  return *p;
}

template <bool kEarly>
__device__ __forceinline__ void ld_bf16x8(const uint16_t* p, float (&x)[8]) {
  if constexpr (kEarly) {
    bf16x8_now(p, x);
  } else {
    load_bf16x8(p, x);
  }
}

template <bool kEarly>
__device__ __forceinline__ void ld_f32x8(const float* p, float (&x)[8]) {
  if constexpr (kEarly) {
    f32x8_now(p, x);
  } else {
    load_f32x8(p, x);
  }
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

template <bool kEarly>
__device__ __forceinline__ void ld_weight(const uint16_t* weight, int lane, float (&w)[2][8]) {
  ld_bf16x8<kEarly>(weight + 8 * lane, w[0]);
  ld_bf16x8<kEarly>(weight + 256 + 8 * lane, w[1]);
}

// latent = bf16((x * nf) * w) of a 512-dim row held as x[h][j] = dim 256 h + 8 lane + j (w likewise).
__device__ __forceinline__ void rms_norm_row(float (&x)[2][8], const float (&w)[2][8], float eps) {
  const float p0 = torch_warp_partial(x[0]), p1 = torch_warp_partial(x[1]);
  float ss = shfl_idx(p0, 0, 32);
#pragma unroll
  for (int k = 1; k < 4; ++k) ss = __fadd_rn(ss, shfl_idx(p0, 8 * k, 32));
#pragma unroll
  for (int k = 0; k < 4; ++k) ss = __fadd_rn(ss, shfl_idx(p1, 8 * k, 32));
  const float nf = norm_factor<kDim>(ss, eps);
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

// Fake quantisation (spec §2.2) of one half row u (dims 256 h + 8 lane + j), in place:
// q = e2m1(u / S + 0) * S, S per 16 dims (2 lanes).
template <bool kFast>
__device__ __forceinline__ void fake_quant_half(float (&u)[8]) {
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

__device__ __forceinline__ uint64_t fp8x8(const float (&x)[8], float inv) {
  const uint32_t lo = quant::pack_fp8x4(__fmul_rn(x[0], inv), __fmul_rn(x[1], inv), __fmul_rn(x[2], inv), __fmul_rn(x[3], inv));
  const uint32_t hi = quant::pack_fp8x4(__fmul_rn(x[4], inv), __fmul_rn(x[5], inv), __fmul_rn(x[6], inv), __fmul_rn(x[7], inv));
  return static_cast<uint64_t>(lo) | (static_cast<uint64_t>(hi) << 32);
}

// Encode and store half h of the rotated row (u: dims 256 h + 8 lane + j; fp4 layouts) or of its
// fake-quantised q (the others) at `slot`. Every lane of the warp must call it (the scale
// reductions shuffle).
template <V41Layout kLayout, bool kFast>
__device__ __forceinline__ void encode_half(float (&u)[8], int h, const Slot& slot, int lane) {
  using T = LayoutTraits<kLayout>;
  if constexpr (T::kFp4) {
    const float amax = lanes_max<2>(abs_max8(u));  // bf16-exact, as u
    const uint32_t code =
        kv_scale_code(scale_quotient<kFast>(amax, quant::kE2m1Max, scale_recip<kFast>(quant::kE2m1Max)));
    const float s = v41q::e4m3_value(code);
    const float r = scale_recip<kFast>(s);
    uint32_t word = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t c = kFast ? v41q::fp4_code(u[j], s, r) : v41q::e2m1_rne(__fdiv_rn(u[j], s));
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
    fake_quant_half<kFast>(u);
    if constexpr (T::kFp8Tiles) {
      const uint32_t bits = quant::float_bits(lanes_max<4>(abs_max8(u)));
      int32_t e = static_cast<int32_t>(bits >> 23) - 8 + ((bits & 0x7FFFFFu) > 0x600000u ? 1 : 0);
      e = e < static_cast<int32_t>(kV41MinExponent) ? static_cast<int32_t>(kV41MinExponent) : e;
      const uint32_t ue = static_cast<uint32_t>(e);
      *reinterpret_cast<uint64_t*>(slot.data + 256 * h + 8 * lane) = fp8x8(u, quant::inv_ue8m0(ue));
      // tile 8 h + lane / 4; lanes 16 g gather four tiles
      const uint32_t e4 = shfl_idx(ue, (lane + 4) & 31, 32), e8 = shfl_idx(ue, (lane + 8) & 31, 32),
                     e12 = shfl_idx(ue, (lane + 12) & 31, 32);
      if ((lane & 15) == 0) {
        *reinterpret_cast<uint32_t*>(slot.scales + 8 * h + lane / 4) = ue | (e4 << 8) | (e8 << 16) | (e12 << 24);
      }
    } else if constexpr (kLayout == V41Layout::kUniformFp8) {
      *reinterpret_cast<uint64_t*>(slot.data + 256 * h + 8 * lane) = fp8x8(u, 1.0f);
    } else {  // V4: 7 tiles of 64 e4m3 + 64 bf16 RoPE dims; scale byte 7 untouched
      // amax: a fake-quant value (bf16-exact, >= 2^-10 when not 0) or the floor 1e-4f, so the
      // fast design's division is exact (host check)
      const float amax = fmaxf(lanes_max<8>(abs_max8(u)), kAmaxFloor);
      const uint32_t ue = quant::ue8m0_ceil(
          scale_quotient<kFast>(amax, quant::kE4m3Max, scale_recip<kFast>(quant::kE4m3Max)));
      const bool rope = h == 1 && lane >= 24;
      if (!rope) {
        *reinterpret_cast<uint64_t*>(slot.data + 256 * h + 8 * lane) = fp8x8(u, quant::inv_ue8m0(ue));
        if ((lane & 7) == 0) slot.scales[4 * h + lane / 8] = static_cast<uint8_t>(ue);
      } else {
        uint4 v;
        v.x = quant::bf16x2_bits(u[0], u[1]);
        v.y = quant::bf16x2_bits(u[2], u[3]);
        v.z = quant::bf16x2_bits(u[4], u[5]);
        v.w = quant::bf16x2_bits(u[6], u[7]);
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

// Publish the latent row, then RoPE at `rope_pos`, quantise and store at `loc` (loc < 0: no store).
template <V41Layout kLayout>
__device__ __forceinline__ void finish_row(float (&x)[2][8], const V41Args& a, int64_t row, int64_t rope_pos,
                                           int64_t loc, int lane) {
  store_bf16x8(a.out + row * kDim + 8 * lane, x[0]);
  store_bf16x8(a.out + row * kDim + 256 + 8 * lane, x[1]);
  if (loc < 0) return;  // warp-uniform
  if (lane >= 24) {
    float cs[8];
    load_f32x8(a.freq + rope_pos * 64 + 8 * (lane - 24), cs);
    rope8(x[1], cs);
  }
  encode_store<kLayout, false>(x, slot_at(a.paging, loc), lane);
}

// Fast design: the RoPE row `cs` (lanes 24..31) was loaded with the row's other operands.
template <V41Layout kLayout>
__device__ __forceinline__ void finish_row_loaded(float (&x)[2][8], const float (&cs)[8], const V41Args& a,
                                                  int64_t row, int64_t loc, int lane) {
  store_bf16x8(a.out + row * kDim + 8 * lane, x[0]);
  store_bf16x8(a.out + row * kDim + 256 + 8 * lane, x[1]);
  if (loc < 0) return;  // warp-uniform
  if (lane >= 24) rope8(x[1], cs);
  encode_store<kLayout, true>(x, slot_at(a.paging, loc), lane);
}

// The RoPE operands of lanes 24..31 for table row `rope_pos` (nothing loaded when !live); kEarly:
// issued here (a plain load may be scheduled next to its use, after the pooling / norm).
template <bool kEarly = false>
__device__ __forceinline__ void load_rope(const V41Args& a, int64_t rope_pos, bool live, int lane, float (&cs)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) cs[j] = 0.0f;
  if (live && lane >= 24) ld_f32x8<kEarly>(a.freq + rope_pos * 64 + 8 * (lane - 24), cs);
}

template <V41Layout kLayout>
__global__ void __launch_bounds__(kThreads) c1_kernel(const V41Args a) {
  pdl_enter<true>();
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= a.rows) return;
  const int64_t loc = load_index(a.loc, a.loc_i64, row);
  const int64_t pos = load_index(a.positions, a.positions_i64, row);
  const uint16_t* in = static_cast<const uint16_t*>(a.input) + row * kDim;
  float x[2][8];
  load_bf16x8(in + 8 * lane, x[0]);
  load_bf16x8(in + 256 + 8 * lane, x[1]);
  rms_norm_row(x, a.norm_weight, a.eps, lane);
  finish_row<kLayout>(x, a, row, pos, loc > 0 ? loc : -1, lane);
}

// Fast design: rows per block = blockDim.x / 32 (the launcher picks it); the RoPE row is loaded
// as soon as the position arrives, so its round trip overlaps the norm.
template <V41Layout kLayout, bool kEarly>
__global__ void __launch_bounds__(kFastMaxThreads) c1_fast_kernel(const V41Args a) {
  pdl_enter<true>();
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= a.rows) return;
  // independent loads first (a load whose address is not ready stalls the warp's issue), then
  // the RoPE row, which needs the position
  const int64_t loc = ld_index<kEarly>(a.loc, a.loc_i64, row);
  const int64_t pos = ld_index<kEarly>(a.positions, a.positions_i64, row);
  const uint16_t* in = static_cast<const uint16_t*>(a.input) + row * kDim;
  float x[2][8], w[2][8], cs[8];
  ld_weight<kEarly>(a.norm_weight, lane, w);
  ld_bf16x8<kEarly>(in + 8 * lane, x[0]);
  ld_bf16x8<kEarly>(in + 256 + 8 * lane, x[1]);
  load_rope<kEarly>(a, pos, loc > 0, lane, cs);
  rms_norm_row(x, w, a.eps);
  finish_row_loaded<kLayout>(x, cs, a, row, loc > 0 ? loc : -1, lane);
}

// RMSNorm of a row split over the two warps of a block (warp h: half h): the eight torch warp
// partials meet in `partial` and every thread adds them in order (rms_norm_row's sum).
__device__ __forceinline__ void rms_norm_half(float (&x)[8], const float (&w)[8], float eps, int h, int lane,
                                              float (&partial)[8]) {
  const float p = torch_warp_partial(x);  // torch warp 4 h + lane / 8
  if ((lane & 7) == 0) partial[4 * h + (lane >> 3)] = p;
  __syncthreads();
  float ss = partial[0];
#pragma unroll
  for (int k = 1; k < 8; ++k) ss = __fadd_rn(ss, partial[k]);
  const float nf = norm_factor<kDim>(ss, eps);
#pragma unroll
  for (int j = 0; j < 8; ++j) x[j] = quant::bf16_round(__fmul_rn(__fmul_rn(x[j], nf), w[j]));
}

// Half h of finish_row_loaded: publish, RoPE (half 1, lanes 24..31), encode and store (loc < 0: none).
template <V41Layout kLayout>
__device__ __forceinline__ void finish_half(float (&x)[8], const float (&cs)[8], const V41Args& a, int64_t row,
                                            int64_t loc, int h, int lane) {
  store_bf16x8(a.out + row * kDim + 256 * h + 8 * lane, x);
  if (loc < 0) return;  // block-uniform
  if (h == 1 && lane >= 24) rope8(x, cs);
  encode_half<kLayout, true>(x, h, slot_at(a.paging, loc), lane);
}

// Design fast2, decode-sized c1 launches: two warps per row (one 64-thread block), warp h holding
// half h (dims 256 h + 8 lane + j), so each lane quantises 8 dims instead of 16. The eight torch
// warp partials meet in shared memory and every thread adds them in order (the same sum as
// rms_norm_row); everything else is per half.
template <V41Layout kLayout>
__global__ void __launch_bounds__(64) c1_split_kernel(const V41Args a) {
  __shared__ float partial[8];
  pdl_enter<true>();
  const int lane = threadIdx.x & 31, h = threadIdx.x >> 5;
  const int64_t row = blockIdx.x;  // the grid has one block per row
  const int64_t loc = ld_index_now(a.loc, a.loc_i64, row);
  const int64_t pos = ld_index_now(a.positions, a.positions_i64, row);
  float x[8], w[8], cs[8];
  bf16x8_now(a.norm_weight + 256 * h + 8 * lane, w);
  bf16x8_now(static_cast<const uint16_t*>(a.input) + row * kDim + 256 * h + 8 * lane, x);
  load_rope<true>(a, pos, loc > 0 && h == 1, lane, cs);
  rms_norm_half(x, w, a.eps, h, lane, partial);
  finish_half<kLayout>(x, cs, a, row, loc > 0 ? loc : -1, h, lane);
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

// exp(x) for x in (-708, 0] (and NaN), exactly as CUDA's exp(double) computes it there: the same
// operations with the same constants as libdevice's __nv_exp (CUDA 12/13 libdevice.10.bc) on the
// path it takes for |x| < 708.4, minus the range test, whose branch split every channel's
// exp into its own convergence region (16 serialised fp64 chains per lane).
__device__ __forceinline__ double exp_libdevice_small(double x) {
  const double t = __fma_rn(x, 0x1.71547652b82fep+0, 0x1.8p+52);  // x log2(e) + 1.5 2^52
  const int n = __double2loint(t);
  const double k = __dadd_rn(t, -0x1.8p+52);
  double r = __fma_rn(k, -0x1.62e42fefa39efp-1, x);
  r = __fma_rn(k, -0x1.abc9e3b39803fp-56, r);
  double p = __fma_rn(0x1.ade1569ce2bdfp-26, r, 0x1.28af3fca213eap-22);
  p = __fma_rn(p, r, 0x1.71dee62401315p-19);
  p = __fma_rn(p, r, 0x1.a01997c89eb71p-16);
  p = __fma_rn(p, r, 0x1.a01a014761f65p-13);
  p = __fma_rn(p, r, 0x1.6c16c1852b7afp-10);
  p = __fma_rn(p, r, 0x1.1111111122322p-7);
  p = __fma_rn(p, r, 0x1.55555555502a1p-5);
  p = __fma_rn(p, r, 0x1.5555555555511p-3);
  p = __fma_rn(p, r, 0x1.000000000000bp-1);
  p = __fma_rn(p, r, 1.0);
  p = __fma_rn(p, r, 1.0);
  return __hiloint2double(__double2hiint(p) + (n << 20), __double2loint(p));
}

// e = fp32(exp(-|d|)) as the base design (fp32(exp(double))): the branch-free copy of the same
// computation, evaluated for every channel (at -104 for |d| >= 104 and NaN, so that no branch
// skips it); |d| >= 104 gives 0 as there (exp(-104) < 2^-150 rounds to +0), NaN gives NaN (its
// payload does not reach any output: a NaN latent is stored as the canonical bf16 NaN).
__device__ __forceinline__ float pair_weight(float d) {
  const float a = fabsf(d);
  const bool small = a < 104.0f;
  const float e = static_cast<float>(exp_libdevice_small(-static_cast<double>(small ? a : 104.0f)));
  return small ? e : (a >= 104.0f ? 0.0f : a);
}

// rcp.approx (relative error < 2^-22 on [1, 2]).
__device__ __forceinline__ float rcp_approx(float d) {
#if FC_GPU_HIP
  return __frcp_rn(d);
#else
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  return r;
#endif
}

// Fast design of pool_pair: the same bf16 results without an IEEE division per channel. With
// d = 1 + e in [1, 2] and r ~ 1 / d (rel. error < 2^-22), q0 = num r and q = q0 + (num - q0 d) r
// (FMAs) is within 0.5 ulp + 2^-40 ulp of num / d, so q is rn(num / d) or one of its fp32
// neighbours. bf16 rounding maps all three to the same value unless q is within a few ulps of a
// bf16 rounding boundary (low 16 bits near 0x8000); that case, and any num outside
// [2^-100, 2^101) (zeros, subnormals, inf, NaN: no ulp bound), takes the IEEE division.
// One half row (8 channels per lane); k1 gets the pooled bf16 values, s1 and k0 are scratch.
__device__ __forceinline__ void pool_half_fast(float (&k1)[8], float (&s1)[8], float (&k0)[8], const float (&s0)[8]) {
  // pass 1: numerator (into k1) and denominator (into s1) of every channel, as pool_pair
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float d = __fsub_rn(s0[j], s1[j]);
    const float e = pair_weight(d);
    const bool first = d > 0.0f;
    const float a0 = first ? 1.0f : e, a1 = first ? e : 1.0f;
    k1[j] = __fmaf_rn(k0[j], a0, __fmul_rn(k1[j], a1));
    s1[j] = __fadd_rn(1.0f, e);
  }
  // pass 2: the quotients (into k0)
  bool exact = false;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float num = k1[j], den = s1[j];
    const float r = rcp_approx(den);
    const float q0 = __fmul_rn(num, r);
    const float q = __fmaf_rn(__fmaf_rn(-q0, den, num), r, q0);
    const uint32_t nb = quant::float_bits(num), qb = quant::float_bits(q);
    const bool out_of_range = ((nb >> 23) & 0xFFu) - 27u > 200u;  // biased exponent outside [27, 227]
    const bool near_tie = (qb & 0xFFFFu) - 0x7FFCu <= 8u;
    exact |= out_of_range | near_tie;  // | (not ||): no branch per channel
    k0[j] = quant::bf16_round(q);
  }
  if (exact) {  // rare: the IEEE division for the lane's 8 channels
#pragma unroll
    for (int j = 0; j < 8; ++j) k0[j] = quant::bf16_round(__fdiv_rn(k1[j], s1[j]));
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) k1[j] = k0[j];
}

__device__ __forceinline__ void pool_pair_fast(float (&k1)[2][8], float (&s1)[2][8], float (&k0)[2][8],
                                               const float (&s0)[2][8]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) pool_half_fast(k1[h], s1[h], k0[h], s0[h]);
}

__device__ __forceinline__ int64_t ring_row(int64_t rid, int64_t pos, int64_t back, int64_t ring) {
  int64_t w = (pos - back) % ring;
  return rid * ring + (w < 0 ? w + ring : w);
}

// c2 decode / verify (kPrefill false) or the prefill pool pass (kPrefill true).
template <V41Layout kLayout, bool kPrefill>
__global__ void __launch_bounds__(kThreads) c2_kernel(const V41Args a) {
  pdl_enter<true>();
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= a.rows) return;
  const int64_t raw = load_index(a.loc, a.loc_i64, row);
  const int64_t pos = load_index(a.positions, a.positions_i64, row);
  if (raw == 0) return;  // padded row: nothing written
  const bool odd = (pos & 1) != 0;
  if (kPrefill && !odd) return;  // the write-back pass parks prefill rows
  const int64_t rid = a.req[row];
  const float* in = static_cast<const float*>(a.input) + row * kStateWidth;
  if (!kPrefill && !odd) {
    copy_pair_row(a.state + ring_row(rid, pos, 0, a.ring_size) * kStateWidth, in, lane);
    return;
  }
  bool from_input;
  if constexpr (kPrefill) {
    from_input = row > 0 && a.req[row - 1] == rid && load_index(a.positions, a.positions_i64, row - 1) == pos - 1 &&
                 load_index(a.loc, a.loc_i64, row - 1) != 0;
  } else {
    from_input = row % a.draft_len != 0;
  }
  const float* partner = from_input ? in - kStateWidth : a.state + ring_row(rid, pos, 1, a.ring_size) * kStateWidth;
  float k1[2][8], s1[2][8], k0[2][8], s0[2][8];
  load_pair_row(in, lane, k1, s1);
  load_pair_row(partner, lane, k0, s0);
  pool_pair(k1, s1, k0, s0);
  rms_norm_row(k1, a.norm_weight, a.eps, lane);
  finish_row<kLayout>(k1, a, row, pos - 1, raw >> 1, lane);
}

// (pos - back) mod ring, non-negative; a power-of-two ring (the usual 2 / 4 / 8) takes a mask.
__device__ __forceinline__ int64_t ring_row_fast(int64_t rid, int64_t pos, int64_t back, int64_t ring) {
  const int64_t p = pos - back;
  if ((ring & (ring - 1)) == 0) return rid * ring + (p & (ring - 1));
  const int64_t w = p % ring;
  return rid * ring + (w < 0 ? w + ring : w);
}

__device__ __forceinline__ void store_pair_row(float* p, int lane, const float (&kv)[2][8], const float (&sc)[2][8]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    store_f32x8(p + 256 * h + 8 * lane, kv[h]);
    store_f32x8(p + kDim + 256 * h + 8 * lane, sc[h]);
  }
}

// Fast design of c2 decode / verify (one warp per row, blockDim.x / 32 rows per block): the
// metadata, the row, the weight and (inside a verify block) the previous input row are one burst
// after the wait; an even row parks the row it holds; an odd row's ring partner and RoPE row are
// the second (and last) group.
template <V41Layout kLayout, bool kEarly>
__global__ void __launch_bounds__(kFastMaxThreads, kFastC2MinBlocks) c2_fast_kernel(const V41Args a) {
  pdl_enter<true>();
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= a.rows) return;
  const float* in = static_cast<const float*>(a.input) + row * kStateWidth;
  const int64_t raw = ld_index<kEarly>(a.loc, a.loc_i64, row);
  const int64_t pos = ld_index<kEarly>(a.positions, a.positions_i64, row);
  const int64_t rid = ld_i64<kEarly>(a.req + row);
  float k1[2][8], s1[2][8], k0[2][8], s0[2][8], w[2][8], cs[8];
  // 32-bit modulo (a 64-bit one is a software routine): a batch has far fewer than 2^32 rows
  const bool from_input = a.draft_len > 1 && static_cast<uint32_t>(row) % static_cast<uint32_t>(a.draft_len) != 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    ld_f32x8<kEarly>(in + 256 * h + 8 * lane, k1[h]);
    ld_f32x8<kEarly>(in + kDim + 256 * h + 8 * lane, s1[h]);
  }
  ld_weight<kEarly>(a.norm_weight, lane, w);
  if (from_input) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      ld_f32x8<kEarly>(in - kStateWidth + 256 * h + 8 * lane, k0[h]);
      ld_f32x8<kEarly>(in - kStateWidth + kDim + 256 * h + 8 * lane, s0[h]);
    }
  }
  if (raw == 0) return;  // padded row: nothing written
  if ((pos & 1) == 0) {
    store_pair_row(a.state + ring_row_fast(rid, pos, 0, a.ring_size) * kStateWidth, lane, k1, s1);
    return;
  }
  // the RoPE row (as the base: none for a row that stores nothing) before the ring partner: kEarly
  // loads keep their order, so neither waits behind the pooling
  load_rope<kEarly>(a, pos - 1, (raw >> 1) >= 0, lane, cs);
  if (!from_input) {
    const float* ring = a.state + ring_row_fast(rid, pos, 1, a.ring_size) * kStateWidth;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      ld_f32x8<kEarly>(ring + 256 * h + 8 * lane, k0[h]);
      ld_f32x8<kEarly>(ring + kDim + 256 * h + 8 * lane, s0[h]);
    }
  }
  pool_pair_fast(k1, s1, k0, s0);
  rms_norm_row(k1, w, a.eps);
  finish_row_loaded<kLayout>(k1, cs, a, row, raw >> 1, lane);
}

// Design fast2, decode-sized c2 decode / verify launches: two warps per row (one 64-thread block),
// warp h holding half h of the kv and score vectors, so each lane pools 8 channels (8 fp64 exps)
// instead of 16; loads as c2_fast_kernel<kLayout, true>, norm as c1_split_kernel.
template <V41Layout kLayout>
__global__ void __launch_bounds__(64) c2_split_kernel(const V41Args a) {
  __shared__ float partial[8];
  pdl_enter<true>();
  const int lane = threadIdx.x & 31, h = threadIdx.x >> 5;
  const int64_t row = blockIdx.x;  // the grid has one block per row
  const float* in = static_cast<const float*>(a.input) + row * kStateWidth;
  const int off = 256 * h + 8 * lane;
  const int64_t raw = ld_index_now(a.loc, a.loc_i64, row);
  const int64_t pos = ld_index_now(a.positions, a.positions_i64, row);
  const int64_t rid = ld_i64_now(a.req + row);
  const bool from_input = a.draft_len > 1 && static_cast<uint32_t>(row) % static_cast<uint32_t>(a.draft_len) != 0;
  float k1[8], s1[8], k0[8], s0[8], w[8], cs[8];
  f32x8_now(in + off, k1);
  f32x8_now(in + kDim + off, s1);
  bf16x8_now(a.norm_weight + off, w);
  if (from_input) {
    f32x8_now(in - kStateWidth + off, k0);
    f32x8_now(in - kStateWidth + kDim + off, s0);
  }
  if (raw == 0) return;  // padded row: nothing written (block-uniform, as every exit below)
  if ((pos & 1) == 0) {
    float* ring = a.state + ring_row_fast(rid, pos, 0, a.ring_size) * kStateWidth;
    store_f32x8(ring + off, k1);
    store_f32x8(ring + kDim + off, s1);
    return;
  }
  load_rope<true>(a, pos - 1, (raw >> 1) >= 0 && h == 1, lane, cs);  // before the ring partner (see c2_fast_kernel)
  if (!from_input) {
    const float* ring = a.state + ring_row_fast(rid, pos, 1, a.ring_size) * kStateWidth;
    f32x8_now(ring + off, k0);
    f32x8_now(ring + kDim + off, s0);
  }
  pool_half_fast(k1, s1, k0, s0);
  rms_norm_half(k1, w, a.eps, h, lane, partial);
  finish_half<kLayout>(k1, cs, a, row, raw >> 1, h, lane);
}

// Fast design of the c2 prefill pool pass: warp w handles rows 2w and 2w + 1, so that a warp
// (and its block's registers) is not spent on an even row, which only the write-back pass
// parks. The metadata of rows 2w - 1 .. 2w + 1 is one burst; then each odd, non-padded row of
// the two loads its row, its partner (the previous input row if same request, previous position
// and not padded, else the ring row of pos - 1) and its RoPE row, and pools, norms and stores.
template <V41Layout kLayout>
__global__ void __launch_bounds__(kFastMaxThreads, kFastC2MinBlocks) c2_prefill_fast_kernel(const V41Args a) {
  pdl_enter<true>();
  const int lane = threadIdx.x & 31;
  const int64_t first = 2 * (static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5));
  if (first >= a.rows) return;
  // metadata of rows first - 1 (clamped to 0: unused there), first, first + 1 (clamped)
  int64_t raw[3], pos[3], rid[3];
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    int64_t r = first - 1 + i;
    r = r < 0 ? 0 : (r >= a.rows ? a.rows - 1 : r);
    raw[i] = load_index(a.loc, a.loc_i64, r);
    pos[i] = load_index(a.positions, a.positions_i64, r);
    rid[i] = a.req[r];
  }
#pragma unroll 1
  for (int i = 1; i <= 2; ++i) {
    // the row's and its predecessor's metadata by select (a dynamic index would go to local memory)
    const bool second = i == 2;
    const int64_t row = first - 1 + i;
    const int64_t r_raw = second ? raw[2] : raw[1], r_pos = second ? pos[2] : pos[1], r_rid = second ? rid[2] : rid[1];
    const int64_t p_raw = second ? raw[1] : raw[0], p_pos = second ? pos[1] : pos[0], p_rid = second ? rid[1] : rid[0];
    if (row >= a.rows || r_raw == 0 || (r_pos & 1) == 0) continue;  // warp-uniform
    const bool from_input = row > 0 && p_rid == r_rid && p_pos == r_pos - 1 && p_raw != 0;
    const float* in = static_cast<const float*>(a.input) + row * kStateWidth;
    float k1[2][8], s1[2][8], k0[2][8], s0[2][8], w[2][8], cs[8];
    load_pair_row(in, lane, k1, s1);
    load_pair_row(from_input ? in - kStateWidth
                             : a.state + ring_row_fast(r_rid, r_pos, 1, a.ring_size) * kStateWidth,
                  lane, k0, s0);
    load_weight(a.norm_weight, lane, w);
    load_rope(a, r_pos - 1, (r_raw >> 1) >= 0, lane, cs);
    pool_pair_fast(k1, s1, k0, s0);
    rms_norm_row(k1, w, a.eps);
    finish_row_loaded<kLayout>(k1, cs, a, row, r_raw >> 1, lane);
  }
}

// Prefill write-back: warp (b, k) copies row start_b + len_b - 1 - k (k < min(len_b, ring), not
// padded) to its ring row. Launched after the pool pass, whose ring reads it must not overtake.
template <int kWarpsPerBlock>
__global__ void __launch_bounds__(kThreads) c2_writeback_kernel(const V41Args a) {
  pdl_enter<true>();
  const int lane = threadIdx.x & 31;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (item >= a.batch * a.ring_size) return;
  const int64_t b = item / a.ring_size, k = item % a.ring_size;
  const int64_t len = a.extend_len[b];
  if (k >= len) return;
  const int64_t row = static_cast<int64_t>(a.extend_start[b]) + len - 1 - k;
  if (row < 0 || row >= a.rows || load_index(a.loc, a.loc_i64, row) == 0) return;
  const int64_t pos = load_index(a.positions, a.positions_i64, row);
  copy_pair_row(a.state + ring_row(a.req[row], pos, 0, a.ring_size) * kStateWidth,
                static_cast<const float*>(a.input) + row * kStateWidth, lane);
}

// ------------------------------------------------------------------ index keys (128 dims, 16 lanes)

template <int kRowsPerBlock>
__global__ void __launch_bounds__(kThreads) index_k_kernel(const V41Args a) {
  pdl_enter<true>();
  const int m = threadIdx.x & 15;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 4);
  // rows past the end compute on the last row (both halves of a warp shuffle) and store nothing
  const bool in_range = r < a.rows;
  const int64_t row = in_range ? r : a.rows - 1;
  const int64_t loc = static_cast<const int64_t*>(a.loc)[row];
  const int64_t pos = load_index(a.positions, a.positions_i64, row);
  float x[8], w[8];
  load_bf16x8(static_cast<const uint16_t*>(a.input) + row * kIndexDim + 8 * m, x);
  load_bf16x8(a.norm_weight + 8 * m, w);
  const bool rope = m >= 8;
  float cs[8];
  if (rope) load_f32x8(a.freq + (pos & ~static_cast<int64_t>(a.ratio - 1)) * 64 + 8 * (m - 8), cs);

  // RMSNorm: torch lane 4 m + i (m < 8) sums ((x0^2 + x1^2) + y0^2) + y1^2, y from lane m + 8
  float sq[8], other[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) sq[j] = __fmul_rn(x[j], x[j]);
#pragma unroll
  for (int j = 0; j < 8; ++j) other[j] = shfl_xor(sq[j], 8, 16);
  float t[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) t[i] = __fadd_rn(__fadd_rn(__fadd_rn(sq[2 * i], sq[2 * i + 1]), other[2 * i]), other[2 * i + 1]);
#pragma unroll
  for (int mask = 4; mask >= 1; mask >>= 1) {
#pragma unroll
    for (int i = 0; i < 4; ++i) t[i] = __fadd_rn(t[i], shfl_xor(t[i], mask, 16));
  }
  const float part = __fadd_rn(__fadd_rn(t[0], t[2]), __fadd_rn(t[1], t[3]));
  const float upper = shfl_xor(part, 8, 16);
  const float nf = norm_factor<kIndexDim>(m < 8 ? part : upper, a.eps);
#pragma unroll
  for (int j = 0; j < 8; ++j) x[j] = quant::bf16_round(__fmul_rn(__fmul_rn(x[j], nf), w[j]));
  if (rope) rope8(x, cs);

  // stage 1 per 32 dims (4 lanes): power-of-two fake quant
  const float amax1 = fmaxf(lanes_max<4>(abs_max8(x)), kStage1Floor);
  const uint32_t e1 = quant::ue8m0_ceil(__fmul_rn(amax1, kInvSix));
  const float inv1 = quant::inv_ue8m0(e1), scale1 = quant::bits_float(e1 << 23);
#pragma unroll
  for (int j = 0; j < 8; ++j) x[j] = __fmul_rn(v41q::e2m1_value(v41q::e2m1_rne(__fmul_rn(x[j], inv1))), scale1);
  // stage 2: the packer, RNE, -0 code rewritten to 0
  const float amax2 = lanes_max<4>(abs_max8(x));
  uint32_t e2 = quant::ue8m0_ceil(fmaxf(__fdiv_rn(amax2, quant::kE2m1Max), kAmaxFloor));
  e2 = e2 < 1 ? 1 : (e2 > 254 ? 254 : e2);
  const float inv2 = quant::inv_ue8m0(e2);
  uint32_t word = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint32_t c = v41q::e2m1_rne(__fmul_rn(x[j], inv2));
    c = c == 8u ? 0u : c;
    word |= c << (4 * j);
  }
  const uint32_t g1 = shfl_idx(e2, 4, 16), g2 = shfl_idx(e2, 8, 16), g3 = shfl_idx(e2, 12, 16);
  if (!in_range || loc <= 0) return;
  const Slot slot = slot_at(a.paging, loc);
  *reinterpret_cast<uint32_t*>(slot.data + 4 * m) = word;
  if (m == 0) *reinterpret_cast<uint32_t*>(slot.scales) = e2 | (g1 << 8) | (g2 << 16) | (g3 << 24);
}

// Fast design: rows per block by launch size. Up to kFastDecodeRowsMax rows (decode, verify)
// one warp per block, so a batch spreads over as many SMs as it has rows; larger launches four
// warps per block (fine-grained blocks: an exiting even prefill row frees its slot at once).
inline constexpr int64_t kFastDecodeRowsMax = 1024;
inline constexpr int kFastWideWarps = kFastMaxThreads / 32;

}  // namespace v41

template <V41Op kOp, V41Layout kLayout, V41Design kDesign>
gpuError_t V41Launch<kOp, kLayout, kDesign>::run(const V41Args& args, gpuStream_t stream) {
  const auto blocks = [](int64_t items, int per_block) { return static_cast<unsigned>((items + per_block - 1) / per_block); };
  if constexpr (kDesign != V41Design::kBase && kOp != V41Op::kIndexK) {
    const bool decode = args.rows <= v41::kFastDecodeRowsMax;
    if constexpr (kDesign == V41Design::kFast2 && kOp != V41Op::kC2Prefill) {
      if (decode) {
        const LaunchConfig split{static_cast<unsigned>(args.rows), 64, 0, 1, kPdlLaunch};
        if constexpr (kOp == V41Op::kC1) {
          return launch_kernel(v41::c1_split_kernel<kLayout>, split, stream, args);
        } else {
          return launch_kernel(v41::c2_split_kernel<kLayout>, split, stream, args);
        }
      }
    }
    const int warps = decode ? 1 : v41::kFastWideWarps;
    const LaunchConfig rows{blocks(args.rows, warps), static_cast<unsigned>(32 * warps), 0, 1, kPdlLaunch};
    if constexpr (kOp == V41Op::kC1) {
      return decode ? launch_kernel(v41::c1_fast_kernel<kLayout, true>, rows, stream, args)
                    : launch_kernel(v41::c1_fast_kernel<kLayout, false>, rows, stream, args);
    } else if constexpr (kOp == V41Op::kC2Decode) {
      return decode ? launch_kernel(v41::c2_fast_kernel<kLayout, true>, rows, stream, args)
                    : launch_kernel(v41::c2_fast_kernel<kLayout, false>, rows, stream, args);
    } else {
      const int64_t pairs = (args.rows + 1) / 2;
      const int pair_warps = pairs <= v41::kFastDecodeRowsMax ? 1 : v41::kFastWideWarps;
      const LaunchConfig pool{blocks(pairs, pair_warps), static_cast<unsigned>(32 * pair_warps), 0, 1, kPdlLaunch};
      const gpuError_t e = launch_kernel(v41::c2_prefill_fast_kernel<kLayout>, pool, stream, args);
      if (e != gpuSuccess) return e;
      const LaunchConfig back{blocks(args.batch * args.ring_size, v41::kWarps), v41::kThreads, 0, 1, kPdlLaunch};
      return launch_kernel(v41::c2_writeback_kernel<v41::kWarps>, back, stream, args);
    }
  } else {
    const LaunchConfig rows{blocks(args.rows, v41::kWarps), v41::kThreads, 0, 1, kPdlLaunch};
    if constexpr (kOp == V41Op::kC1) {
      return launch_kernel(v41::c1_kernel<kLayout>, rows, stream, args);
    } else if constexpr (kOp == V41Op::kC2Decode) {
      return launch_kernel(v41::c2_kernel<kLayout, false>, rows, stream, args);
    } else if constexpr (kOp == V41Op::kC2Prefill) {
      const gpuError_t e = launch_kernel(v41::c2_kernel<kLayout, true>, rows, stream, args);
      if (e != gpuSuccess) return e;
      const LaunchConfig back{blocks(args.batch * args.ring_size, v41::kWarps), v41::kThreads, 0, 1, kPdlLaunch};
      return launch_kernel(v41::c2_writeback_kernel<v41::kWarps>, back, stream, args);
    } else {
      const LaunchConfig idx{blocks(args.rows, v41::kIndexRowsPerBlock), v41::kThreads, 0, 1, kPdlLaunch};
      return launch_kernel(v41::index_k_kernel<v41::kIndexRowsPerBlock>, idx, stream, args);
    }
  }
}

}  // namespace flashcompress
