// flashcompress: the fast designs of the v41 kernels (`design` "fast" / "fast2"; the launcher in
// v41.cuh picks them), the same bytes as the base kernels of v41.cuh.
//
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
// Design fast2 (kFast2): fast, plus two warps per row (one 64-thread block, warp h holding half h)
// for decode-sized c1 and c2 decode / verify launches (c1_split_kernel, c2_split_kernel).
// Design fast3 (kFast3): fast2's launches and kernels; the wide c1 / c2 kernels and the c2
// prefill pool pass with the row arithmetic of v41_fast3.cuh (the kernels' `kDesign` parameter:
// kFast for fast and fast2, kFast3 for fast3; the split kernels are fast2's).
#pragma once

#include <cstdint>

#include "arch.cuh"
#include "gpu_runtime.h"
#include "ptx.cuh"
#include "quant.cuh"
#include "v41_common.cuh"
#include "v41_fast3.cuh"
#include "v41_launch.h"
#include "v41_quant.cuh"

namespace flashcompress {
namespace v41 {

// Fast design: at most 4 warps per block; c2 capped at 128 registers (4 such blocks per SM), which
// keeps its 16 fp64 exps per lane from taking 200+ registers.
inline constexpr int kFastMaxThreads = 128;
inline constexpr int kFastC2MinBlocks = 4;

// Loads that stay where the source puts them (ld.volatile: ptxas neither sinks them past a branch
// nor reorders them among themselves), so that a row's independent loads leave in one burst.
// They compile to LDG.STRONG.SYS, served by L2 without L1 allocation: fine for operands read once
// per warp. (HIP, which the family does not build today: plain loads.)
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

template <bool kEarly>
__device__ __forceinline__ void ld_weight(const uint16_t* weight, int lane, float (&w)[2][8]) {
  ld_bf16x8<kEarly>(weight + 8 * lane, w[0]);
  ld_bf16x8<kEarly>(weight + 256 + 8 * lane, w[1]);
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

// Norm, publish, RoPE, encode and store of a loaded row: rms_norm_row + finish_row_loaded (kFast)
// or their fast3 arithmetic (kFast3).
template <V41Layout kLayout, V41Design kDesign>
__device__ __forceinline__ void norm_finish(float (&x)[2][8], const float (&w)[2][8], const float (&cs)[8],
                                            const V41Args& a, int64_t row, int64_t loc, int lane) {
  if constexpr (kDesign == V41Design::kFast3) {
    norm_finish_fast3<kLayout>(x, w, cs, a, row, loc, lane);
  } else {
    rms_norm_row(x, w, a.eps);
    finish_row_loaded<kLayout>(x, cs, a, row, loc, lane);
  }
}

// Fast design: rows per block = blockDim.x / 32 (the launcher picks it); the RoPE row is loaded
// as soon as the position arrives, so its round trip overlaps the norm.
template <V41Layout kLayout, bool kEarly, V41Design kDesign>
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
  norm_finish<kLayout, kDesign>(x, w, cs, a, row, loc > 0 ? loc : -1, lane);
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

// The constants of libdevice's __nv_exp fast path (CUDA 12/13 libdevice.10.bc): log2(e), the
// rounding shift 1.5 2^52, ln 2 high / low, then the polynomial's coefficients from the highest.
#define FC_V41_EXP_CONSTANTS                                                                             \
  0x1.71547652b82fep+0, 0x1.8p+52, 0x1.62e42fefa39efp-1, 0x1.abc9e3b39803fp-56, 0x1.ade1569ce2bdfp-26, \
      0x1.28af3fca213eap-22, 0x1.71dee62401315p-19, 0x1.a01997c89eb71p-16, 0x1.a01a014761f65p-13,      \
      0x1.6c16c1852b7afp-10, 0x1.1111111122322p-7, 0x1.55555555502a1p-5, 0x1.5555555555511p-3,         \
      0x1.000000000000bp-1
// Constant i as an immediate (after unrolling and inlining) or (kConstBank, fast3) from the constant
// bank, which the fp64 FMAs read as an operand; an immediate the compiler moves into a uniform
// register pair first, again for every unrolled group of channels.
static __constant__ double kExpConstantBank[] = {FC_V41_EXP_CONSTANTS};
template <bool kConstBank>
__device__ __forceinline__ double exp_constant(int i) {
  if constexpr (kConstBank) {
    return kExpConstantBank[i];
  } else {
    constexpr double kImmediate[] = {FC_V41_EXP_CONSTANTS};
    return kImmediate[i];
  }
}
#undef FC_V41_EXP_CONSTANTS

// exp(x) for x in (-708, 0] (and NaN), exactly as CUDA's exp(double) computes it there: the same
// operations with the same constants as libdevice's __nv_exp on the path it takes for
// |x| < 708.4, minus the range test, whose branch split every channel's exp into its own
// convergence region (16 serialised fp64 chains per lane). kConstBank: the constants from the
// constant bank (fast3), else immediates.
template <bool kConstBank = false>
__device__ __forceinline__ double exp_libdevice_small(double x) {
  const auto c = [](int i) { return exp_constant<kConstBank>(i); };
  const double t = __fma_rn(x, c(0), c(1));  // x log2(e) + 1.5 2^52
  const int n = __double2loint(t);
  const double k = __dadd_rn(t, -c(1));
  double r = __fma_rn(k, -c(2), x);
  r = __fma_rn(k, -c(3), r);
  double p = __fma_rn(c(4), r, c(5));
#pragma unroll
  for (int i = 6; i < 14; ++i) p = __fma_rn(p, r, c(i));
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

// Fast3: pair_weight's value for every d. The exp runs on min(|d|, 104) (fminf: NaN -> 104), whose
// result is already pair_weight's for |d| >= 104 (fp32(exp(-104)) = +0, host check), and
// max.NaN(e, -|d|) is e (>= 0 >= -|d|) except for a NaN d, which it returns as a NaN.
__device__ __forceinline__ float pair_weight_fast3(float d) {
  const float a = fabsf(d);
  const float e = static_cast<float>(exp_libdevice_small<true>(-static_cast<double>(fminf(a, 104.0f))));
  return max_nan(e, -a);
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

// Fast3 of pool_half_fast's pass 2 (the same quotients and fallback): |num| outside [2^-100, 2^101)
// (NaN included) by two compares of the magnitude instead of extracting the biased exponent, and
// the bf16 rounding two values per cvt.rn.bf16x2 (the same RNE). k0[j] = bf16(k1[j] / s1[j]).
__device__ __forceinline__ void pool_quotients_fast3(const float (&k1)[8], const float (&s1)[8], float (&k0)[8]) {
  bool exact = false;
  float q[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float num = k1[j], den = s1[j];
    const float r = rcp_approx(den);
    const float q0 = __fmul_rn(num, r);
    q[j] = __fmaf_rn(__fmaf_rn(-q0, den, num), r, q0);
    const bool out_of_range = !(fabsf(num) >= 0x1p-100f && fabsf(num) < 0x1p101f);
    const bool near_tie = (quant::float_bits(q[j]) & 0xFFFFu) - 0x7FFCu <= 8u;
    exact |= out_of_range | near_tie;
  }
  if (exact) {  // rare: the IEEE division for the lane's 8 channels
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = __fdiv_rn(k1[j], s1[j]);
  }
#pragma unroll
  for (int j = 0; j < 8; j += 2) {
    const uint32_t w = quant::bf16x2_bits(q[j], q[j + 1]);
    k0[j] = quant::bf16x2_lo(w);
    k0[j + 1] = quant::bf16x2_hi(w);
  }
}

// Fast design of pool_pair: the same bf16 results without an IEEE division per channel. With
// d = 1 + e in [1, 2] and r ~ 1 / d (rel. error < 2^-22), q0 = num r and q = q0 + (num - q0 d) r
// (FMAs) is within 0.5 ulp + 2^-40 ulp of num / d, so q is rn(num / d) or one of its fp32
// neighbours. bf16 rounding maps all three to the same value unless q is within a few ulps of a
// bf16 rounding boundary (low 16 bits near 0x8000); that case, and any num outside
// [2^-100, 2^101) (zeros, subnormals, inf, NaN: no ulp bound), takes the IEEE division.
// One half row (8 channels per lane); k1 gets the pooled bf16 values, s1 and k0 are scratch.
// kDesign: the pair weight of kFast (pair_weight) or kFast3 (pair_weight_fast3).
template <V41Design kDesign = V41Design::kFast>
__device__ __forceinline__ void pool_half_fast(float (&k1)[8], float (&s1)[8], float (&k0)[8], const float (&s0)[8]) {
  // pass 1: numerator (into k1) and denominator (into s1) of every channel, as pool_pair
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float d = __fsub_rn(s0[j], s1[j]);
    const float e = kDesign == V41Design::kFast3 ? pair_weight_fast3(d) : pair_weight(d);
    const bool first = d > 0.0f;
    const float a0 = first ? 1.0f : e, a1 = first ? e : 1.0f;
    k1[j] = __fmaf_rn(k0[j], a0, __fmul_rn(k1[j], a1));
    s1[j] = __fadd_rn(1.0f, e);
  }
  // pass 2: the quotients (into k0)
  bool exact = false;
  if constexpr (kDesign == V41Design::kFast3) {
    pool_quotients_fast3(k1, s1, k0);
  } else {
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
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) k1[j] = k0[j];
}

template <V41Design kDesign = V41Design::kFast>
__device__ __forceinline__ void pool_pair_fast(float (&k1)[2][8], float (&s1)[2][8], float (&k0)[2][8],
                                               const float (&s0)[2][8]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) pool_half_fast<kDesign>(k1[h], s1[h], k0[h], s0[h]);
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
template <V41Layout kLayout, bool kEarly, V41Design kDesign>
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
  pool_pair_fast<kDesign>(k1, s1, k0, s0);
  norm_finish<kLayout, kDesign>(k1, w, cs, a, row, raw >> 1, lane);
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
template <V41Layout kLayout, V41Design kDesign>
__global__ void __launch_bounds__(kFastMaxThreads, kFastC2MinBlocks)
    c2_prefill_fast_kernel(const V41Args a) {
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
    if constexpr (kDesign != V41Design::kFast3) load_weight(a.norm_weight, lane, w);
    load_rope(a, r_pos - 1, (r_raw >> 1) >= 0, lane, cs);
    pool_pair_fast<kDesign>(k1, s1, k0, s0);
    if constexpr (kDesign == V41Design::kFast3) load_weight(a.norm_weight, lane, w);
    norm_finish<kLayout, kDesign>(k1, w, cs, a, row, r_raw >> 1, lane);
  }
}

// Fast design: rows (c2 prefill: row pairs) per block by launch size. Up to kFastDecodeRowsMax
// (decode, verify) one warp per block (fast2: two warps per row), so a batch spreads over as many
// SMs as it has rows; larger launches four warps per block.
inline constexpr int64_t kFastDecodeRowsMax = 1024;
inline constexpr int kFastWideWarps = kFastMaxThreads / 32;

}  // namespace v41
}  // namespace flashcompress
