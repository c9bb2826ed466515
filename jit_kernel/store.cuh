// flashcompress: RMSNorm + interleaved RoPE (+ 128-point Hadamard) + quantised paged store of
// one compressed KV row per 32-lane warp (spec store-and-jit.md §4-§6). Device code; included
// by kernel TUs only (the store family, and the compress family's fused store epilogue).
//
// store_row<kHeadDim, kFmt>(v, lane, position, loc, args)   -- the warp-cooperative row store
//   v         fp32, pre-norm, canonical row layout: lane `lane` holds
//               v[4*j + i] = dim 128*j + 4*lane + i,   j < kHeadDim/128, i < 4
//             (so the 64 RoPE dims are v[4*(J-1) .. 4*(J-1)+3] of lanes 16..31, J = kHeadDim/128;
//             every lane's data bytes are contiguous and a warp's stores coalesce)
//   position  RoPE row of args.freq (no bound check, like the peer)
//   loc       cache slot: page = loc >> page_shift, slot = loc & (page_size - 1)
//   All 32 lanes of the warp must call it together (butterfly shuffles, full mask).
// store_row_ops<kHeadDim, kFmt>(v, ops, lane, loc, args)   -- the same with the lane's weight and
//   RoPE operands already in hand: from block_operands (global memory, what store_row does) or
//   staged_operands (shared-memory copies that stage_weight / stage_rope filled by cp.async; the
//   compress kernel's epilogue, which stages them while it pools the row).
//
// Per row (fp32 unless noted; the reference is torch_backend/store.py):
//   ss = sum x^2 in fp64 (exact squares; the reference's fp64 sum), rounded once to fp32
//   nf = fp32(1 / sqrt(fp64(ss / H + eps)))  -- correctly rounded, as the reference computes it
//   y  = (x * nf) * w;   RoPE on the last 64 dims: re' = fma(re, c, -(im s)), im' = fma(re, s, im c)
//   H = 128: Walsh-Hadamard (bits 0..6: bits 0-1 inside a lane, 2-6 across lanes), * rsqrtf(128)
//   encode, formats (bytes per token; data at page*page_bytes + slot*data, scales after the
//   page's data region at page*page_bytes + P*data + slot*scale):
//     kV4        H 512: 448 e4m3 (7 tiles of 64 dims: bf16-rounded values, ue8m0 scale of
//                max(amax, 1e-4)/448) + 64 bf16 rope | 7 ue8m0 bytes (pad byte 7 untouched)
//     kIndexFp8  H 128: 128 e4m3 of h / scale | fp32 scale = max(amax, 1e-4)/448
//     kIndexFp4  H 128: 64 bytes of e2m1 threshold-code pairs (4 groups of 32, ue8m0 scale of
//                max(amax, 1e-4)/6, even dim in the low nibble) | 4 ue8m0 bytes
//     kBf16      H 512: 512 bf16 (row loc of 1024-byte rows)
//   Lane stores: V4 4 B codes per 128-dim block (lanes 16..31 of the last block: 8 B of rope),
//   scales by the lanes (16*h + j) that own tile 2j+h; idx fp8 4 B + lane 0 the scale; idx fp4
//   2 B + lanes 0, 8, 16, 24 one scale byte each; bf16 8 B per block.
//
// store_slice<kHeadDim, kFmt, kSliceDims>(y, ops, lane, dim0, ss, loc, args)   -- one slice of a row
//   For rows pooled by several blocks (the compress kernel's C128 cluster): a warp holds dims
//   [dim0, dim0 + 64 | 128) in their canonical lanes, the row's fp64 sum of squares `ss` comes
//   from slice_sum_squares of every slice (added in slice order), `ops` from block_operands
//   (weight and RoPE row, loaded before the exchange). V4 and bf16 only: their tiles lie within
//   64 dims; the indexer's Hadamard mixes a whole 128-dim row. Same bytes as store_row.
//
// The standalone kernel (StoreLaunch<kHeadDim, kFmt, kIn>::run, store_launch.h):
//   kv [rows, H] fp32 | bf16; plan [rows, 16]; grid ceil(rows / 8), block 256 = 8 warps, warp w of
//   block b owns plan row 8b + w (surplus warps of the last block exit). Per row it loads the kv
//   row (one 16-B / 8-B load per lane per 128 dims) together with the plan row (decode
//   DecodePlan: stored iff seq_len % ratio == 0, dest out_loc[row]; prefill CompressPlan: stored
//   iff seq_len != 0xFFFFFFFF, dest out_loc[ragged_id]; position int32(seq_len - ratio)), then --
//   only for stored rows -- out_loc, the weight and the RoPE row, and calls store_row. Skipped
//   rows write nothing. Launch on the caller's stream, no host synchronisation, graph-capturable;
//   on SM90 (FC_ENABLE_PDL, cudaLaunchKernelEx) a programmatic dependent of the stream's previous
//   kernel: it waits before its first load and lets the next kernel launch right after the wait.
//
// Host emulation (tests/native/store_host_emulator.cu): with FC_STORE_HOST_EMULATION defined the
// row functions are __host__ __device__ and the host pass exchanges lane values through
// store::host_lanes::shfl_xor (provided by the emulator, one std::thread per lane), in the same
// butterfly order as vec.cuh's group_max / group_sum.
#pragma once

#include <cstdint>

#include "gpu_runtime.h"
#include "launch.h"
#include "layout.h"
#include "quant.cuh"
#include "store_args.h"
#include "store_launch.h"
#include "vec.cuh"

#if defined(FC_STORE_HOST_EMULATION)
#define FC_STORE_FN __host__ __device__ __forceinline__
#else
#define FC_STORE_FN __device__ __forceinline__
#endif

// Unroll hints only where they mean something (host compilers warn about the pragma).
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define FC_STORE_UNROLL _Pragma("unroll")
#else
#define FC_STORE_UNROLL
#endif

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__) || !defined(FC_STORE_HOST_EMULATION)
#define FC_STORE_LANES_ON_DEVICE 1
#else
#define FC_STORE_LANES_ON_DEVICE 0
#endif

namespace flashcompress {
namespace store {

#if defined(FC_STORE_HOST_EMULATION)
namespace host_lanes {
// The value of `v` held by lane (this lane ^ mask) of the emulated warp (defined by the emulator).
float shfl_xor(float v, int mask);
double shfl_xor(double v, int mask);
}  // namespace host_lanes
#endif

inline constexpr int kWarpLanes = 32;
inline constexpr int kRopeDim = 64;
inline constexpr int kWarpsPerBlock = 8;
inline constexpr int kBlockThreads = kWarpsPerBlock * kWarpLanes;
inline constexpr float kAmaxFloor = 1e-4f;
inline constexpr uint32_t kHadamardScaleBits = 0x3DB504F3u;  // rsqrtf(128), correctly rounded

// Bytes per token of each format (layout.h): data region, then scale region of the page.
template <StoreFormat kFmt>
struct FormatTraits {
  static constexpr int kHeadDim = static_cast<int>(cache_format(kFmt).head_dim);
  static constexpr int kDataBytes = static_cast<int>(cache_format(kFmt).data_bytes);
  static constexpr int kScaleBytes = static_cast<int>(cache_format(kFmt).scale_bytes);
};

namespace detail {

// ------------------------------------------------------------------ lane exchange

// op-reduction over aligned groups of W lanes: vec.cuh's group_reduce on the GPU; the emulator's
// host lanes in the same butterfly order.
template <int W, typename T, typename Op>
FC_STORE_FN T lanes_reduce(T v, Op op) {
#if FC_STORE_LANES_ON_DEVICE
  return group_reduce<W>(v, op);
#else
  for (int m = W / 2; m >= 1; m /= 2) v = op(v, host_lanes::shfl_xor(v, m));
  return v;
#endif
}

template <int W>
FC_STORE_FN float lanes_max(float v) {
  return lanes_reduce<W>(v, [](float a, float b) { return fmaxf(a, b); });
}

template <int W>
FC_STORE_FN double lanes_sum_f64(double v) {
  return lanes_reduce<W>(v, [](double a, double b) { return a + b; });
}

FC_STORE_FN float lane_xor(float v, int mask) {
#if FC_STORE_LANES_ON_DEVICE
  return shfl_xor(v, mask, kWarpLanes);
#else
  return host_lanes::shfl_xor(v, mask);
#endif
}

// ------------------------------------------------------------------ memory access

FC_STORE_FN Vec<float, 4> load4(const float* p) { return *reinterpret_cast<const Vec<float, 4>*>(p); }

FC_STORE_FN void load4_bf16(const uint16_t* p, float (&out)[4]) {
  const Vec<uint16_t, 4> b = *reinterpret_cast<const Vec<uint16_t, 4>*>(p);
FC_STORE_UNROLL
  for (int i = 0; i < 4; ++i) out[i] = quant::bf16_to_float(b.v[i]);
}

FC_STORE_FN void store_u16(uint8_t* p, uint32_t x) { *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(x); }
FC_STORE_FN void store_u32(uint8_t* p, uint32_t x) { *reinterpret_cast<uint32_t*>(p) = x; }
FC_STORE_FN void store_u64(uint8_t* p, uint64_t x) { *reinterpret_cast<uint64_t*>(p) = x; }

FC_STORE_FN uint64_t bf16x4(const float* y) {
  return static_cast<uint64_t>(quant::bf16x2_bits(y[0], y[1])) |
         (static_cast<uint64_t>(quant::bf16x2_bits(y[2], y[3])) << 32);
}

FC_STORE_FN float abs_max4(const float* u) {
  // fmaxf from 0 ignores NaN, like the reference's amax (NaN -> 0).
  float a = 0.0f;
FC_STORE_UNROLL
  for (int i = 0; i < 4; ++i) a = fmaxf(a, fabsf(u[i]));
  return a;
}

// Where the entry of slot `loc` lives: its data bytes and its scale bytes.
struct Entry {
  uint8_t* data;
  uint8_t* scales;
};

template <StoreFormat kFmt>
FC_STORE_FN Entry entry_at(const StoreArgs& args, int64_t loc) {
  using T = FormatTraits<kFmt>;
  const int64_t page = loc >> args.page_shift;
  const int64_t slot = loc & ((int64_t{1} << args.page_shift) - 1);
  uint8_t* base = args.cache + page * args.page_bytes;
  return {base + slot * T::kDataBytes,
          base + (int64_t{T::kDataBytes} << args.page_shift) + slot * T::kScaleBytes};
}

// ------------------------------------------------------------------ encoders (one 128-dim block)

// V4 block j (dims 128j .. 128j+127): e4m3 tiles 2j (lanes 0-15) and 2j+1 (lanes 16-31); block 3,
// lanes 16-31: the 64 bf16 RoPE dims. Lanes with `active` false take part in the butterfly (their
// values are zeros) and store nothing.
FC_STORE_FN void encode_v4_block(const float (&y)[4], int j, int lane, bool active, const Entry& e) {
  const int half = lane >> 4;
  const uint32_t p01 = quant::bf16x2_bits(y[0], y[1]), p23 = quant::bf16x2_bits(y[2], y[3]);
  const float u[4] = {quant::bf16x2_lo(p01), quant::bf16x2_hi(p01), quant::bf16x2_lo(p23), quant::bf16x2_hi(p23)};
  // every lane takes part in the butterfly; the rope lanes' result of block 3 is unused
  const float amax = fmaxf(lanes_max<16>(abs_max4(u)), kAmaxFloor);
  const uint32_t exp = quant::ue8m0_ceil(quant::div_rn(amax, quant::kE4m3Max));
  const float inv = quant::inv_ue8m0(exp);
  if (!active) return;
  if (!(j == 3 && half == 1)) {
    store_u32(e.data + 128 * j + 4 * lane, quant::pack_fp8x4(u[0] * inv, u[1] * inv, u[2] * inv, u[3] * inv));
    if ((lane & 15) == j) e.scales[2 * j + half] = static_cast<uint8_t>(exp);
  } else {
    store_u64(e.data + 448 + 8 * (lane - 16), bf16x4(y));
  }
}

FC_STORE_FN void encode_bf16_block(const float (&y)[4], int j, int lane, bool active, const Entry& e) {
  if (active) store_u64(e.data + 256 * j + 8 * lane, bf16x4(y));
}

FC_STORE_FN void encode_index_fp8(const float (&h)[4], int lane, const Entry& e) {
  const float amax = fmaxf(lanes_max<32>(abs_max4(h)), kAmaxFloor);
  const float scale = quant::div_rn(amax, quant::kE4m3Max);
  const float inv = quant::div_rn(1.0f, scale);
  store_u32(e.data + 4 * lane, quant::pack_fp8x4(h[0] * inv, h[1] * inv, h[2] * inv, h[3] * inv));
  if (lane == 0) *reinterpret_cast<float*>(e.scales) = scale;
}

FC_STORE_FN void encode_index_fp4(const float (&h)[4], int lane, const Entry& e) {
  // group g = dims 32g..32g+31 = lanes 8g..8g+7
  const float amax = fmaxf(lanes_max<8>(abs_max4(h)), kAmaxFloor);
  const uint32_t exp = quant::ue8m0_ceil(quant::div_rn(amax, quant::kE2m1Max));
  const float inv = quant::inv_ue8m0(exp);
  uint32_t c[4];
FC_STORE_UNROLL
  for (int i = 0; i < 4; ++i) c[i] = quant::e2m1_threshold(h[i] * inv);
  store_u16(e.data + 2 * lane, c[0] | (c[1] << 4) | (c[2] << 8) | (c[3] << 12));
  if ((lane & 7) == 0) e.scales[lane >> 3] = static_cast<uint8_t>(exp);
}

// ------------------------------------------------------------------ transforms

// Unnormalised Sylvester Walsh-Hadamard over 128 dims (index d = 4*lane + i), butterflies on
// bits 0..6 in that order (lower index a + b, upper a - b), then * rsqrtf(128).
FC_STORE_FN void hadamard128(float (&v)[4], int lane) {
  float t0 = v[0] + v[1], t1 = v[0] - v[1], t2 = v[2] + v[3], t3 = v[2] - v[3];  // bit 0
  v[0] = t0 + t2;                                                                 // bit 1
  v[2] = t0 - t2;
  v[1] = t1 + t3;
  v[3] = t1 - t3;
FC_STORE_UNROLL
  for (int mask = 1; mask < kWarpLanes; mask <<= 1) {  // bits 2..6 = lane bits 0..4
    const bool upper = (lane & mask) != 0;
FC_STORE_UNROLL
    for (int i = 0; i < 4; ++i) {
      const float other = lane_xor(v[i], mask);
      v[i] = upper ? other - v[i] : v[i] + other;
    }
  }
  const float scale = quant::bits_float(kHadamardScaleBits);
FC_STORE_UNROLL
  for (int i = 0; i < 4; ++i) v[i] *= scale;
}

// ------------------------------------------------------------------ norm and RoPE of one block

// What a lane needs to finish its 4 dims 128j + 4 lane + i of a block: the norm weight and, on a
// RoPE lane (lanes 16-31 of the last block), the (cos, sin) pairs of its two dim pairs. Loaded
// before the reduction that gives the norm factor, so the loads overlap it.
struct BlockOperands {
  float w[4];
  Vec<float, 4> cs;
  bool rope;
};

// The operands of a lane from where they live (global memory, or the staged copies): its 4
// weight dims as fp32 (w32) or bf16 bit patterns (w16; exactly one of the two is set) and, on a
// RoPE lane, its 4 (cos, sin) values at cs.
FC_STORE_FN BlockOperands operands_from(const float* w32, const uint16_t* w16, bool rope, const float* cs) {
  BlockOperands o;
  if (w16 != nullptr) {
    load4_bf16(w16, o.w);
  } else {
    const Vec<float, 4> w = load4(w32);
FC_STORE_UNROLL
    for (int i = 0; i < 4; ++i) o.w[i] = w.v[i];
  }
  o.rope = rope;
  o.cs = Vec<float, 4>{{1.0f, 0.0f, 1.0f, 0.0f}};
  if (rope) o.cs = load4(cs);
  return o;
}

template <int kHeadDim>
FC_STORE_FN bool rope_lane(int j, int lane) {
  return j == kHeadDim / 128 - 1 && lane >= 16;
}

template <int kHeadDim>
FC_STORE_FN BlockOperands block_operands(const StoreArgs& args, int j, int lane, int64_t position) {
  const int d = 128 * j + 4 * lane;
  const bool rope = rope_lane<kHeadDim>(j, lane);
  return operands_from(args.norm_weight_bf16 != nullptr ? nullptr : args.norm_weight + d,
                       args.norm_weight_bf16 != nullptr ? args.norm_weight_bf16 + d : nullptr, rope,
                       rope ? args.freq + position * kRopeDim + 4 * (lane - 16) : nullptr);
}

// nf = fp32(1 / sqrt(fp64(fp32(ss) / H + eps))) from the row's fp64 sum of squares.
template <int kHeadDim>
FC_STORE_FN float norm_factor(double ss, float eps) {
  const float mean = quant::div_rn(static_cast<float>(ss), static_cast<float>(kHeadDim)) + eps;
  return static_cast<float>(1.0 / sqrt(static_cast<double>(mean)));
}

// y = (x * nf) * w, then on a RoPE lane the interleaved rotation of pairs (0, 1) and (2, 3):
// lane 16 + m holds RoPE pairs 2m and 2m + 1.
FC_STORE_FN void norm_rope_block(float (&y)[4], float nf, const BlockOperands& o) {
FC_STORE_UNROLL
  for (int i = 0; i < 4; ++i) y[i] = (y[i] * nf) * o.w[i];
  if (o.rope) {
FC_STORE_UNROLL
    for (int q = 0; q < 2; ++q) {
      const float re = y[2 * q], im = y[2 * q + 1];
      const float c = o.cs.v[2 * q], s = o.cs.v[2 * q + 1];
      y[2 * q] = fmaf(re, c, -(im * s));
      y[2 * q + 1] = fmaf(re, s, im * c);
    }
  }
}

FC_STORE_FN double sum_squares4(const float (&y)[4]) {
  double ss = 0.0;
FC_STORE_UNROLL
  for (int i = 0; i < 4; ++i) ss += static_cast<double>(y[i]) * static_cast<double>(y[i]);
  return ss;
}

template <int kHeadDim, StoreFormat kFmt>
FC_STORE_FN void check_format() {
  static_assert(kHeadDim == 128 || kHeadDim == 512, "head dim must be 128 or 512");
  static_assert(kFmt != StoreFormat::kNone, "a store needs a cache format");
  static_assert(FormatTraits<kFmt>::kHeadDim == kHeadDim,
                "format / head dim mismatch: V4 and bf16 store 512 dims, the indexer formats 128");
}

}  // namespace detail

// One 32-lane warp stores one row whose weight and RoPE operands `ops` (block_operands, or
// staged_operands) it already holds.
template <int kHeadDim, StoreFormat kFmt>
FC_STORE_FN void store_row_ops(float (&v)[kHeadDim / 32], const detail::BlockOperands (&ops)[kHeadDim / 128],
                               int lane, int64_t loc, const StoreArgs& args) {
  detail::check_format<kHeadDim, kFmt>();
  constexpr int kBlocks = kHeadDim / 128;
  float (*blk)[4] = reinterpret_cast<float (*)[4]>(v);  // blk[j] = block j of this lane

  // RMSNorm, then RoPE on the last 64 dims.
  double ss = 0.0;
FC_STORE_UNROLL
  for (int j = 0; j < kBlocks; ++j) ss += detail::sum_squares4(blk[j]);
  ss = detail::lanes_sum_f64<kWarpLanes>(ss);
  const float nf = detail::norm_factor<kHeadDim>(ss, args.norm_eps);
FC_STORE_UNROLL
  for (int j = 0; j < kBlocks; ++j) detail::norm_rope_block(blk[j], nf, ops[j]);

  const detail::Entry entry = detail::entry_at<kFmt>(args, loc);
  if constexpr (kFmt == StoreFormat::kV4 || kFmt == StoreFormat::kBf16) {
FC_STORE_UNROLL
    for (int j = 0; j < kBlocks; ++j) {
      if constexpr (kFmt == StoreFormat::kV4) {
        detail::encode_v4_block(blk[j], j, lane, true, entry);
      } else {
        detail::encode_bf16_block(blk[j], j, lane, true, entry);
      }
    }
  } else {
    detail::hadamard128(blk[0], lane);
    if constexpr (kFmt == StoreFormat::kIndexFp8) {
      detail::encode_index_fp8(blk[0], lane, entry);
    } else {
      detail::encode_index_fp4(blk[0], lane, entry);
    }
  }
}

// One 32-lane warp stores one row (see the file comment for the layout and the math).
template <int kHeadDim, StoreFormat kFmt>
FC_STORE_FN void store_row(float (&v)[kHeadDim / 32], int lane, int64_t position, int64_t loc,
                           const StoreArgs& args) {
  // Issue the weight and RoPE-table loads before the reduction.
  detail::BlockOperands ops[kHeadDim / 128];
FC_STORE_UNROLL
  for (int j = 0; j < kHeadDim / 128; ++j) ops[j] = detail::block_operands<kHeadDim>(args, j, lane, position);
  store_row_ops<kHeadDim, kFmt>(v, ops, lane, loc, args);
}

// ------------------------------------------------------------------ operands staged in shared memory
//
// The compress kernel's store epilogue copies a lane's weight dims and the row's RoPE pairs into
// shared memory asynchronously (async_copy) when the row starts, so the store after the pooling
// reads nothing from global memory. A lane stages exactly the operands it reads back: only its
// own async_wait orders them, no barrier. Device code only.
//   w[k]  one 128-dim weight block per slot: fp32 dims 128j + 4 lane + i at [4 lane + i], or the
//         bf16 bit patterns (norm_weight_bf16) at uint16 index [4 lane + i]
//   cs    64 floats: the row's RoPE table row (lanes 16..31 stage and read 4 floats each)
template <int kBlocks>
struct alignas(16) StagedOperands {
  float w[kBlocks][128];  // slot k: one 128-dim weight block
  float cs[kRopeDim];
};

// Stage weight block j into slot `slot` (this lane's 4 dims).
template <int kBlocks>
__device__ __forceinline__ void stage_weight(const StoreArgs& args, int j, int slot, int lane, StagedOperands<kBlocks>& s) {
  if (args.norm_weight_bf16 != nullptr) {
    async_copy<8>(reinterpret_cast<uint16_t*>(s.w[slot]) + 4 * lane, args.norm_weight_bf16 + 128 * j + 4 * lane);
  } else {
    async_copy<16>(s.w[slot] + 4 * lane, args.norm_weight + 128 * j + 4 * lane);
  }
}

template <int kBlocks>
__device__ __forceinline__ void stage_rope(const StoreArgs& args, int lane, int64_t position, StagedOperands<kBlocks>& s) {
  if (lane >= 16) async_copy<16>(s.cs + 4 * (lane - 16), args.freq + position * kRopeDim + 4 * (lane - 16));
}

// block_operands of block j from the staged copies in slot `slot` (after the lane's async_wait).
template <int kHeadDim, int kBlocks>
__device__ __forceinline__ detail::BlockOperands staged_operands(const StoreArgs& args, int j, int slot, int lane,
                                                                 const StagedOperands<kBlocks>& s) {
  const bool bf16 = args.norm_weight_bf16 != nullptr;
  const bool rope = detail::rope_lane<kHeadDim>(j, lane);
  return detail::operands_from(bf16 ? nullptr : s.w[slot] + 4 * lane,
                               bf16 ? reinterpret_cast<const uint16_t*>(s.w[slot]) + 4 * lane : nullptr, rope,
                               rope ? s.cs + 4 * (lane - 16) : nullptr);
}

// ------------------------------------------------------------------ a row stored in slices
//
// A row split over several warps (the compress kernel's C128 store, a thread block cluster with
// kSliceDims = 64 or 128 channels per block): each warp holds the dims [dim0, dim0 + kSliceDims)
// in the canonical lanes of their 128-dim block j = dim0 / 128 (lane l: dims 128j + 4l + i; a
// 64-dim slice fills lanes 16h..16h+15, h = dim0 / 64 % 2, and the other lanes hold zeros),
// computes slice_sum_squares, the warps exchange the partial sums, and each calls store_slice
// with the row's sum (the partials added in slice order, so every warp gets the same nf). Only
// formats whose tiles lie inside a 64-dim slice: V4 (7 e4m3 tiles of 64 + the RoPE tile) and
// bf16 (no scales); the indexer formats' Hadamard mixes a whole 128-dim row.
template <int kSliceDims>
FC_STORE_FN bool slice_lane(int dim0, int lane) {
  static_assert(kSliceDims == 64 || kSliceDims == 128, "a slice is 64 or 128 dims");
  if constexpr (kSliceDims == 128) {
    return true;
  } else {
    return (lane >> 4) == ((dim0 >> 6) & 1);
  }
}

// The warp's fp64 sum of squares of its slice (lanes outside the slice hold zeros).
FC_STORE_FN double slice_sum_squares(const float (&y)[4]) {
  return detail::lanes_sum_f64<kWarpLanes>(detail::sum_squares4(y));
}

template <int kHeadDim, StoreFormat kFmt, int kSliceDims>
FC_STORE_FN void store_slice(float (&y)[4], const detail::BlockOperands& ops, int lane, int dim0, double ss,
                             int64_t loc, const StoreArgs& args) {
  detail::check_format<kHeadDim, kFmt>();
  static_assert(kFmt == StoreFormat::kV4 || kFmt == StoreFormat::kBf16,
                "sliced rows: V4 and bf16 only (the indexer's Hadamard needs the whole row)");
  const float nf = detail::norm_factor<kHeadDim>(ss, args.norm_eps);
  detail::norm_rope_block(y, nf, ops);
  const detail::Entry entry = detail::entry_at<kFmt>(args, loc);
  const bool active = slice_lane<kSliceDims>(dim0, lane);
  if constexpr (kFmt == StoreFormat::kV4) {
    detail::encode_v4_block(y, dim0 / 128, lane, active, entry);
  } else {
    detail::encode_bf16_block(y, dim0 / 128, lane, active, entry);
  }
}

// Where plan row `row` of the standalone kernel stores (false: the row is skipped). Decode's slot
// is out_loc[row], prefill's out_loc[ragged_id] (read from the plan row).
struct RowDest {
  int64_t position;  // RoPE row
  int64_t loc;       // cache slot
};

FC_STORE_FN bool plan_row_dest(const StoreKernelArgs& args, int64_t row, RowDest& d) {
  uint32_t seq_len;
  if (args.is_decode) {
    d.loc = args.out_loc[row];
    seq_len = reinterpret_cast<const DecodePlan*>(args.plan)[row].seq_len;
    // ratio 4 or 128 (the API's compress ratios): a mask, not a division
    if ((seq_len & (args.ratio - 1)) != 0) return false;
  } else {
    const CompressPlan p = reinterpret_cast<const CompressPlan*>(args.plan)[row];
    seq_len = p.seq_len;
    if (seq_len == kInvalidU32) return false;
    d.loc = args.out_loc[p.ragged_id];
  }
  d.position = static_cast<int32_t>(seq_len - args.ratio);  // u32 subtraction as int32, as the peer does
  return true;
}

// Lane `lane`'s values of kv row `row` in the canonical layout (fp32).
template <int kHeadDim, RowDtype kIn>
FC_STORE_FN void load_kv_row(const StoreKernelArgs& args, int64_t row, int lane, float (&v)[kHeadDim / 32]) {
FC_STORE_UNROLL
  for (int j = 0; j < kHeadDim / 128; ++j) {
    const int64_t offset = row * kHeadDim + 128 * j + 4 * lane;
    if constexpr (kIn == RowDtype::kF32) {
      const Vec<float, 4> x = detail::load4(static_cast<const float*>(args.kv) + offset);
FC_STORE_UNROLL
      for (int i = 0; i < 4; ++i) v[4 * j + i] = x.v[i];
    } else {
      float x[4];
      detail::load4_bf16(static_cast<const uint16_t*>(args.kv) + offset, x);
FC_STORE_UNROLL
      for (int i = 0; i < 4; ++i) v[4 * j + i] = x[i];
    }
  }
}

// One plan row of the standalone kernel (warp-uniform: every lane takes the same branch). The kv
// row does not depend on the plan row: it is loaded first, so a stored row waits on one round
// trip (plan row and kv row) before the one of its slot, weight and RoPE row; a skipped row's kv
// loads are wasted (mostly decode: 3 of 4 C4 requests).
template <int kHeadDim, StoreFormat kFmt, RowDtype kIn>
FC_STORE_FN void store_plan_row(const StoreKernelArgs& args, int64_t row, int lane) {
  float v[kHeadDim / 32];
  load_kv_row<kHeadDim, kIn>(args, row, lane, v);
  RowDest d;
  if (!plan_row_dest(args, row, d)) return;
  store_row<kHeadDim, kFmt>(v, lane, d.position, d.loc, args.store);
}

// ------------------------------------------------------------------ kernels and launchers

// Blocks per SM the register budget must allow: head 128 keeps the whole SM (32 registers; the
// 8192-row launch of a 32768-token prefill is then one wave), head 512 four blocks (64).
template <int kHeadDim>
inline constexpr int kStoreMinBlocks = kHeadDim == 128 ? 8 : 4;

template <int kHeadDim, StoreFormat kFmt, RowDtype kIn>
__global__ void __launch_bounds__(kBlockThreads, kStoreMinBlocks<kHeadDim>) store_kernel(const StoreKernelArgs args) {
  const int lane = static_cast<int>(threadIdx.x) & (kWarpLanes - 1);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x / kWarpLanes);
  // A programmatic dependent of the previous kernel (sm_90): parameters read first (one field
  // from each 32-byte span), nothing from global memory before the wait; the grid fills every
  // block slot, so the next kernel may launch at once (gpu_runtime.h).
  pdl_warm_params(fold_params(args.kv, args.rows, args.store.norm_weight_bf16, args.store.freq_rows));
  pdl_enter<true>();
  if (row >= args.rows) return;  // whole warps only
  store_plan_row<kHeadDim, kFmt, kIn>(args, row, lane);
  pdl_leave<true>();
}

}  // namespace store

template <int kHeadDim, StoreFormat kFmt, RowDtype kIn>
gpuError_t StoreLaunch<kHeadDim, kFmt, kIn>::run(const StoreKernelArgs& args, gpuStream_t stream) {
  if (args.rows <= 0) return gpuSuccess;
  const int64_t blocks = (args.rows + store::kWarpsPerBlock - 1) / store::kWarpsPerBlock;
  // CUDA sm_90+: a programmatic dependent of the previous kernel
  return launch_kernel(store::store_kernel<kHeadDim, kFmt, kIn>,
                       {static_cast<unsigned>(blocks), static_cast<unsigned>(store::kBlockThreads), 0, 1, kPdlLaunch},
                       stream, args);
}

}  // namespace flashcompress
