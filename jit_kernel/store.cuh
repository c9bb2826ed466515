// flashcompress: RMSNorm + interleaved RoPE (+ 128-point Hadamard) + quantised paged store of
// one compressed KV row per 32-lane warp (spec store-and-jit.md §4-§6). Device code; included
// by kernel TUs only (the store family, and the compress family's fused store epilogue).
//
// store_row_ops<kHeadDim, kFmt>(v, ops, lane, loc, args)   -- the warp-cooperative row store
//   v         fp32, pre-norm, canonical row layout: lane `lane` holds
//               v[4*j + i] = dim 128*j + 4*lane + i,   j < kHeadDim/128, i < 4
//             (so the 64 RoPE dims are v[4*(J-1) .. 4*(J-1)+3] of lanes 16..31, J = kHeadDim/128;
//             every lane's data bytes are contiguous and a warp's stores coalesce)
//   ops       the lane's weight and RoPE operands (position: RoPE row of args.freq, no bound
//             check, like the peer): from block_operands (global memory) or staged_operands
//             (shared-memory copies that stage_weight / stage_rope filled by cp.async; the
//             compress kernel's epilogue, which stages them while it pools the row)
//   loc       cache slot: page = loc >> page_shift, slot = loc & (page_size - 1)
//   All 32 lanes of the warp must call it together (butterfly shuffles, full mask).
// store_blocks<kHeadDim, kFmt, kBpw>(blk, ops, j0, lane, ss, loc, args)   -- norm, RoPE and encode
//   of kBpw blocks j0.. of a row whose fp64 sum of squares ss is known (block_sum_squares per
//   warp, added in block order): store_row_ops and the standalone kernel's teams.
//
// Per row (fp32 unless noted; the reference is torch_backend/store.py):
//   ss = sum x^2 in fp64 (exact squares; the reference's fp64 sum): each 128-dim block's warp
//        butterfly, the blocks added in block order; rounded once to fp32
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
//   the V4.1 layouts (layout.h is_v41_layout; spec store-and-jit.md §5.3-5.5), from y itself (no
//   bf16 round trip; bf16 rows: y rounded to bf16 before the RoPE and the rotated dims after it):
//     kV41 / kV41New          H 512: 512 e4m3 (16 tiles of 32 = 8 lanes, exponent
//                             v41_tile_exponent(amax), no clip) | 16 ue8m0 bytes
//     kV41Fp4 / kV41Fp4New    H 512: 256 bytes of RNE e2m1 pairs (32 tiles of 16 = 4 lanes, scale
//                             S = e4m3(clamp(amax / 6, 2^-9, 448)), codes of y / S) | 32 e4m3 bytes
//     kUniformFp8             H 512: 512 e4m3 of clip448(y), no scales
//     *New: interleaved, a token's scales right after its data at page*page_bytes + slot*bytes/token
//   Lane stores: V4 4 B codes per 128-dim block (lanes 16..31 of the last block: 8 B of rope),
//   scales by the lanes (16*h + j) that own tile 2j+h; idx fp8 4 B + lane 0 the scale; idx fp4
//   2 B + lanes 0, 8, 16, 24 one scale byte each; bf16 8 B per block; v41 / uniform 4 B per block
//   (v41: lanes 0, 8, 16, 24 one exponent byte each); v41 fp4 2 B per block + lanes 4k one scale byte.
//
// store_slice<kHeadDim, kFmt, kSliceDims>(y, ops, lane, dim0, ss, loc, args)   -- one slice of a row
//   For rows pooled by several blocks (the compress kernel's C128 cluster): a warp holds dims
//   [dim0, dim0 + 64 | 128) in their canonical lanes, the row's fp64 sum of squares `ss` comes
//   from slice_sum_squares of every slice (added in slice order), `ops` from block_operands
//   (weight and RoPE row, loaded before the exchange). V4 and bf16 only: their tiles lie within
//   64 dims; the indexer's Hadamard mixes a whole 128-dim row. Same bytes as store_row_ops.
//
// The standalone kernel (StoreLaunch<kHeadDim, kFmt, kIn>::run, store_launch.h):
//   kv [rows, H] fp32 | bf16; plan [rows, 16]. A team of kRowWarps warps stores one plan row,
//   warp w holding 128-dim blocks kBpw w .. kBpw w + kBpw - 1 (kBpw = H / 128 / kRowWarps):
//   head 512 in launches of <= kWideRowsMax (1024) rows 4 warps (one block each, a 128-thread
//   block per row), larger launches one warp per row (8 rows per 256-thread block); head 128 one
//   warp. Per row, one burst of loads (plan row, kv and weight blocks, decode's out_loc[row]),
//   the plan test (decode DecodePlan: stored iff seq_len % ratio == 0, dest out_loc[row]; prefill
//   CompressPlan: stored iff seq_len != 0xFFFFFFFF, dest out_loc[ragged_id]; position
//   int32(seq_len - ratio)), then the RoPE row (and prefill's out_loc) while the blocks' fp64
//   sums of squares are taken; the row's sum adds the blocks' sums in block order (shared memory
//   across the team), exactly as the compress epilogue's sliced store does. Skipped rows write
//   nothing. Launch on the caller's stream, no host synchronisation, graph-capturable; on SM90
//   (FC_ENABLE_PDL, cudaLaunchKernelEx) a programmatic dependent of the stream's previous kernel:
//   it waits before its first load and lets the next kernel launch right after the wait.
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
#if !FC_GPU_HIP  // the V4.1 layouts are CUDA-only (as the v41 family): HIP store builds stay as they were
#include "v41_quant.cuh"
#endif

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
inline constexpr float kAmaxFloor = 1e-4f;
inline constexpr uint32_t kHadamardScaleBits = 0x3DB504F3u;  // rsqrtf(128), correctly rounded

// Bytes per token of each format (layout.h): data region, then scale region of the page.
template <StoreFormat kFmt>
struct FormatTraits {
  static constexpr int kHeadDim = static_cast<int>(cache_format(kFmt).head_dim);
  static constexpr int kDataBytes = static_cast<int>(cache_format(kFmt).data_bytes);
  static constexpr int kScaleBytes = static_cast<int>(cache_format(kFmt).scale_bytes);
  static constexpr bool kInterleaved = cache_format(kFmt).interleaved;
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
  if constexpr (T::kInterleaved) {
    uint8_t* data = base + slot * (T::kDataBytes + T::kScaleBytes);
    return {data, data + T::kDataBytes};
  } else {
    return {base + slot * T::kDataBytes,
            base + (int64_t{T::kDataBytes} << args.page_shift) + slot * T::kScaleBytes};
  }
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

// The V4.1 layouts' block j (dims 128j .. 128j+127, this lane's 4 dims 128j + 4 lane + i). Every
// lane of the warp must call it (the scale reductions shuffle within groups of 8 / 4 lanes).
template <StoreFormat kFmt>
FC_STORE_FN void encode_v41_block(const float (&y)[4], int j, int lane, const Entry& e) {
#if FC_GPU_HIP
  static_assert(kFmt == StoreFormat::kNone, "the V4.1 store layouts have no HIP build (CUDA only)");
  (void)y, (void)j, (void)lane, (void)e;
#else
  if constexpr (kFmt == StoreFormat::kV41 || kFmt == StoreFormat::kV41New) {
    // tile 4j + lane / 8: 32 dims, 8 lanes; e4m3 of y * 2^(127 - e) without a clip (|value| <= 448
    // by the exponent; a NaN stays NaN, 0x7F, as the reference)
    const uint32_t ue = v41q::v41_tile_exponent(lanes_max<8>(abs_max4(y)));
    const float inv = quant::inv_ue8m0(ue);
    store_u32(e.data + 128 * j + 4 * lane, quant::e4m3_code(y[0] * inv) | (quant::e4m3_code(y[1] * inv) << 8) |
                                               (quant::e4m3_code(y[2] * inv) << 16) |
                                               (quant::e4m3_code(y[3] * inv) << 24));
    if ((lane & 7) == 0) e.scales[4 * j + (lane >> 3)] = static_cast<uint8_t>(ue);
  } else if constexpr (kFmt == StoreFormat::kV41Fp4 || kFmt == StoreFormat::kV41Fp4New) {
    // tile 8j + lane / 4: 16 dims, 4 lanes; codes of the IEEE quotient by the rounded scale
    const uint32_t code = v41q::fp4_scale_code(quant::div_rn(lanes_max<4>(abs_max4(y)), quant::kE2m1Max));
    const float scale = v41q::e4m3_value(code);
    uint32_t c[4];
FC_STORE_UNROLL
    for (int i = 0; i < 4; ++i) c[i] = v41q::e2m1_rne(quant::div_rn(y[i], scale));
    store_u16(e.data + 64 * j + 2 * lane, c[0] | (c[1] << 4) | (c[2] << 8) | (c[3] << 12));
    if ((lane & 3) == 0) e.scales[8 * j + (lane >> 2)] = static_cast<uint8_t>(code);
  } else {
    static_assert(kFmt == StoreFormat::kUniformFp8, "a V4.1 layout");
    (void)lane;
    store_u32(e.data + 128 * j + 4 * lane, quant::pack_fp8x4(y[0], y[1], y[2], y[3]));
  }
#endif
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
// lane 16 + m holds RoPE pairs 2m and 2m + 1. kRound (the V4.1 layouts of bf16 rows): y rounded
// to bf16 before the rotation and the rotated values again after it.
template <bool kRound = false>
FC_STORE_FN void norm_rope_block(float (&y)[4], float nf, const BlockOperands& o) {
FC_STORE_UNROLL
  for (int i = 0; i < 4; ++i) y[i] = (y[i] * nf) * o.w[i];
  if constexpr (kRound) {
FC_STORE_UNROLL
    for (int i = 0; i < 4; ++i) y[i] = quant::bf16_round(y[i]);
  }
  if (o.rope) {
FC_STORE_UNROLL
    for (int q = 0; q < 2; ++q) {
      const float re = y[2 * q], im = y[2 * q + 1];
      const float c = o.cs.v[2 * q], s = o.cs.v[2 * q + 1];
      y[2 * q] = fmaf(re, c, -(im * s));
      y[2 * q + 1] = fmaf(re, s, im * c);
    }
    if constexpr (kRound) {
FC_STORE_UNROLL
      for (int i = 0; i < 4; ++i) y[i] = quant::bf16_round(y[i]);
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

// The row's fp64 sum of squares from the lane values of `kBpw` 128-dim blocks: each block's warp
// sum (slice_sum_squares), then the blocks added in block order, exactly as the compress
// epilogue's sliced store and the multi-warp standalone kernel add them (head 128: one block, the
// same bytes as a lane-order sum).
template <int kBpw>
FC_STORE_FN void block_sum_squares(const float (&blk)[kBpw][4], double (&part)[kBpw]) {
FC_STORE_UNROLL
  for (int b = 0; b < kBpw; ++b) part[b] = detail::lanes_sum_f64<kWarpLanes>(detail::sum_squares4(blk[b]));
}

// Norm, RoPE and encode of `kBpw` consecutive 128-dim blocks j0 .. j0 + kBpw - 1 of a row whose
// fp64 sum of squares is `ss` (a warp's share of the row; the indexer formats: the whole row).
// kRound: the bf16 rounding around the RoPE of the V4.1 layouts' bf16 rows (kRoundsRows).
template <int kHeadDim, StoreFormat kFmt, int kBpw, bool kRound = false>
FC_STORE_FN void store_blocks(float (&blk)[kBpw][4], const detail::BlockOperands (&ops)[kBpw], int j0, int lane,
                              double ss, int64_t loc, const StoreArgs& args) {
  detail::check_format<kHeadDim, kFmt>();
  static_assert(!kRound || is_v41_layout(kFmt), "only the V4.1 layouts round rows to bf16 around the RoPE");
  const float nf = detail::norm_factor<kHeadDim>(ss, args.norm_eps);
FC_STORE_UNROLL
  for (int b = 0; b < kBpw; ++b) detail::norm_rope_block<kRound>(blk[b], nf, ops[b]);
  const detail::Entry entry = detail::entry_at<kFmt>(args, loc);
  if constexpr (is_v41_layout(kFmt)) {
FC_STORE_UNROLL
    for (int b = 0; b < kBpw; ++b) detail::encode_v41_block<kFmt>(blk[b], j0 + b, lane, entry);
  } else if constexpr (kFmt == StoreFormat::kV4 || kFmt == StoreFormat::kBf16) {
FC_STORE_UNROLL
    for (int b = 0; b < kBpw; ++b) {
      if constexpr (kFmt == StoreFormat::kV4) {
        detail::encode_v4_block(blk[b], j0 + b, lane, true, entry);
      } else {
        detail::encode_bf16_block(blk[b], j0 + b, lane, true, entry);
      }
    }
  } else {
    static_assert(kBpw == 1, "the indexer formats store a 128-dim row");
    detail::hadamard128(blk[0], lane);
    if constexpr (kFmt == StoreFormat::kIndexFp8) {
      detail::encode_index_fp8(blk[0], lane, entry);
    } else {
      detail::encode_index_fp4(blk[0], lane, entry);
    }
  }
}

// One 32-lane warp stores one row whose weight and RoPE operands `ops` (block_operands, or
// staged_operands) it already holds.
template <int kHeadDim, StoreFormat kFmt>
FC_STORE_FN void store_row_ops(float (&v)[kHeadDim / 32], const detail::BlockOperands (&ops)[kHeadDim / 128],
                               int lane, int64_t loc, const StoreArgs& args) {
  constexpr int kBlocks = kHeadDim / 128;
  float (&blk)[kBlocks][4] = *reinterpret_cast<float (*)[kBlocks][4]>(v);  // blk[j] = block j of this lane
  double part[kBlocks];
  block_sum_squares<kBlocks>(blk, part);
  double ss = 0.0;
FC_STORE_UNROLL
  for (int j = 0; j < kBlocks; ++j) ss += part[j];
  store_blocks<kHeadDim, kFmt, kBlocks>(blk, ops, 0, lane, ss, loc, args);
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

// ------------------------------------------------------------------ the standalone kernel's rows
//
// A team of kRowWarps warps stores one plan row; warp w of the team holds the kBpw = H / 128 /
// kRowWarps blocks j = kBpw w .. kBpw w + kBpw - 1 in the canonical lanes (lane l: dims 128 j +
// 4 l + i). begin_row issues, in one burst, the plan row, the kv blocks, the weight blocks and
// (decode) out_loc[row] -- none depends on another --, tests the plan row, then issues the only
// loads that depend on it (the RoPE row on the lanes that rotate, prefill's out_loc[ragged_id])
// and computes the blocks' warp sums of squares while they are in flight. The team adds the
// blocks' sums in block order (through shared memory when kRowWarps > 1) and finish_row stores
// the warp's blocks. Same bytes as the compress epilogue's store for every kRowWarps.

// Where a stored plan row goes.
struct RowDest {
  int64_t position;  // RoPE row
  int64_t loc;       // cache slot
};

// Lane values of 4 consecutive elements at `p + offset` as fp32 (16-B / 8-B load).
template <RowDtype kIn>
FC_STORE_FN void load_row4(const void* p, int64_t offset, float (&out)[4]) {
  if constexpr (kIn == RowDtype::kF32) {
    const Vec<float, 4> x = detail::load4(static_cast<const float*>(p) + offset);
FC_STORE_UNROLL
    for (int i = 0; i < 4; ++i) out[i] = x.v[i];
  } else {
    detail::load4_bf16(static_cast<const uint16_t*>(p) + offset, out);
  }
}

// One warp's share of a plan row.
template <int kHeadDim, int kRowWarps>
struct RowShare {
  static constexpr int kBlocks = kHeadDim / 128;
  static constexpr int kBpw = kBlocks / kRowWarps;  // blocks of this warp
  static_assert(kBpw >= 1 && kBlocks % kRowWarps == 0, "a warp holds whole 128-dim blocks");
  float v[kBpw][4];                     // kv values
  detail::BlockOperands ops[kBpw];      // weight and RoPE operands
  double part[kBpw];                    // warp sums of squares of the blocks
  RowDest d;
};

// Warp w's loads and partial sums of plan row `row`; false: the row is skipped (decode: seq_len
// % ratio != 0; prefill: seq_len == 0xFFFFFFFF), nothing is written. Warp-uniform, and uniform
// over the team (every warp reads the same plan row).
template <int kHeadDim, RowDtype kIn, int kRowWarps>
FC_STORE_FN bool begin_row(const StoreKernelArgs& args, int64_t row, int w, int lane, RowShare<kHeadDim, kRowWarps>& s) {
  using S = RowShare<kHeadDim, kRowWarps>;
  // The burst: plan row, kv and weight blocks, decode's slot. In the standalone kernel the
  // weight is in the row dtype (norm_weight for fp32 rows, norm_weight_bf16 for bf16 rows).
  uint32_t seq_len, ragged_id = 0;
  if (args.is_decode) {
    seq_len = reinterpret_cast<const DecodePlan*>(args.plan)[row].seq_len;
    s.d.loc = args.out_loc[row];
  } else {
    // seq_len and ragged_id (the first 8 bytes of the CompressPlan row) in one load
    const Vec<uint32_t, 2> p = *reinterpret_cast<const Vec<uint32_t, 2>*>(args.plan + row * kCompressPlanBytes);
    seq_len = p.v[0];
    ragged_id = p.v[1] & 0xFFFFu;
  }
  const void* weight = kIn == RowDtype::kF32 ? static_cast<const void*>(args.store.norm_weight)
                                             : static_cast<const void*>(args.store.norm_weight_bf16);
FC_STORE_UNROLL
  for (int b = 0; b < S::kBpw; ++b) {
    const int d = 128 * (S::kBpw * w + b) + 4 * lane;
    load_row4<kIn>(args.kv, row * kHeadDim + d, s.v[b]);
    load_row4<kIn>(weight, d, s.ops[b].w);
    s.ops[b].rope = false;
    s.ops[b].cs = Vec<float, 4>{{1.0f, 0.0f, 1.0f, 0.0f}};
  }
  if (args.is_decode) {
    // ratio 4 or 128 (the API's compress ratios): a mask, not a division
    if ((seq_len & (args.ratio - 1)) != 0) return false;
  } else {
    if (seq_len == kInvalidU32) return false;
    s.d.loc = args.out_loc[ragged_id];
  }
  s.d.position = static_cast<int32_t>(seq_len - args.ratio);  // u32 subtraction as int32, as the peer does
  if (detail::rope_lane<kHeadDim>(S::kBpw * w + S::kBpw - 1, lane)) {
    s.ops[S::kBpw - 1].rope = true;
    s.ops[S::kBpw - 1].cs = detail::load4(args.store.freq + s.d.position * kRopeDim + 4 * (lane - 16));
  }
  block_sum_squares<S::kBpw>(s.v, s.part);
  return true;
}

// Whether the standalone store rounds rows of dtype kIn to bf16 around the RoPE: the V4.1
// layouts' bf16 rows (the peer rounds to the row dtype there; fp32 rows: a no-op, not done).
template <StoreFormat kFmt, RowDtype kIn>
inline constexpr bool kRoundsRows = is_v41_layout(kFmt) && kIn == RowDtype::kBF16;

// Warp w stores its blocks of the row whose sum of squares (all blocks, block order) is `ss`.
template <int kHeadDim, StoreFormat kFmt, int kRowWarps, bool kRound = false>
FC_STORE_FN void finish_row(RowShare<kHeadDim, kRowWarps>& s, double ss, int w, int lane, const StoreArgs& args) {
  using S = RowShare<kHeadDim, kRowWarps>;
  store_blocks<kHeadDim, kFmt, S::kBpw, kRound>(s.v, s.ops, S::kBpw * w, lane, ss, s.d.loc, args);
}

// Warps per row: head-512 rows of launches of at most kWideRowsMax rows (decode) spread over 4
// warps, those of larger launches (prefill) stay on one warp (it keeps the most bytes in flight
// per SM); head 128 one warp (the Hadamard mixes the whole row across the warp's lanes). HIP: one
// warp per row. (The benchmark that chose them: benchmarks/RESULTS.md, session 16.)
template <int kHeadDim>
inline constexpr int kWideWarps = (kHeadDim == 128 || FC_GPU_HIP) ? 1 : 4;
template <int kHeadDim>
inline constexpr int kNarrowWarps = 1;
inline constexpr int64_t kWideRowsMax = 1024;

// One warp plays every warp of a team of kRowWarps in turn (the row sums exchanged in
// registers): the host emulator's row code (tests/native/store_host_emulator.cu), and the same
// loads, sums and stores as the kernel's team.
template <int kHeadDim, StoreFormat kFmt, RowDtype kIn, int kRowWarps = kWideWarps<kHeadDim>>
FC_STORE_FN void store_plan_row(const StoreKernelArgs& args, int64_t row, int lane) {
  RowShare<kHeadDim, kRowWarps> s[kRowWarps];
FC_STORE_UNROLL
  for (int w = 0; w < kRowWarps; ++w) {
    if (!begin_row<kHeadDim, kIn, kRowWarps>(args, row, w, lane, s[w])) return;
  }
  double ss = 0.0;
FC_STORE_UNROLL
  for (int w = 0; w < kRowWarps; ++w) {
FC_STORE_UNROLL
    for (int b = 0; b < RowShare<kHeadDim, kRowWarps>::kBpw; ++b) ss += s[w].part[b];
  }
FC_STORE_UNROLL
  for (int w = 0; w < kRowWarps; ++w) {
    finish_row<kHeadDim, kFmt, kRowWarps, kRoundsRows<kFmt, kIn>>(s[w], ss, w, lane, args.store);
  }
}

// ------------------------------------------------------------------ kernels and launchers

// A block: one row of kRowWarps warps (kRowWarps > 1; the team's barrier is the block's), or 8
// rows of one warp. Resident blocks the register budget must allow: 48 warps per SM for teams
// (<= 40 registers: 12 rows of 4 warps, 1584 rows per wave on 132 SMs), the whole SM for head-128
// rows (<= 32 registers: a 32768-token prefill is one wave) and 4 blocks of one-warp head-512
// rows (<= 64 registers: 32 rows of 2 KB in flight per SM).
template <int kHeadDim, int kRowWarps>
struct StoreTiling {
  static constexpr int kRowsPerBlock = kRowWarps == 1 ? 8 : 1;
  static constexpr int kThreads = kRowsPerBlock * kRowWarps * kWarpLanes;
  static constexpr int kMinBlocks = kRowWarps > 1 ? 1536 / kThreads : (kHeadDim == 512 ? 4 : 8);
};

template <int kHeadDim, StoreFormat kFmt, RowDtype kIn, int kRowWarps>
__global__ void __launch_bounds__((StoreTiling<kHeadDim, kRowWarps>::kThreads),
                                  (launch_min_blocks(StoreTiling<kHeadDim, kRowWarps>::kMinBlocks, 1,
                                                     StoreTiling<kHeadDim, kRowWarps>::kThreads)))
    store_kernel(const StoreKernelArgs args) {
  using T = StoreTiling<kHeadDim, kRowWarps>;
  using S = RowShare<kHeadDim, kRowWarps>;
  const int lane = static_cast<int>(threadIdx.x) & (kWarpLanes - 1);
  const int warp = static_cast<int>(threadIdx.x) / kWarpLanes;
  const int w = warp % kRowWarps;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * T::kRowsPerBlock + warp / kRowWarps;
  // A programmatic dependent of the previous kernel (sm_90): parameters read first (one field
  // from each 32-byte span), nothing from global memory before the wait; the next kernel may
  // launch right after the wait (gpu_runtime.h).
  pdl_warm_params(fold_params(args.kv, args.rows, args.store.norm_weight_bf16, args.store.freq_rows));
  pdl_enter<true>();
  if (row >= args.rows) return;  // whole warps (kRowWarps > 1: the whole block)
  S s;
  if (!begin_row<kHeadDim, kIn, kRowWarps>(args, row, w, lane, s)) return;  // the whole team
  double ss = 0.0;
  if constexpr (kRowWarps == 1) {
FC_STORE_UNROLL
    for (int b = 0; b < S::kBpw; ++b) ss += s.part[b];
  } else {
    // the blocks' sums meet in shared memory, added in block order by every thread
    __shared__ double part[S::kBlocks];
    if (lane == 0) {
FC_STORE_UNROLL
      for (int b = 0; b < S::kBpw; ++b) part[S::kBpw * w + b] = s.part[b];
    }
    __syncthreads();
FC_STORE_UNROLL
    for (int r = 0; r < S::kBlocks; ++r) ss += part[r];
  }
  finish_row<kHeadDim, kFmt, kRowWarps, kRoundsRows<kFmt, kIn>>(s, ss, w, lane, args.store);
  pdl_leave<true>();
}

template <int kHeadDim, StoreFormat kFmt, RowDtype kIn, int kRowWarps>
gpuError_t launch_rows(const StoreKernelArgs& args, gpuStream_t stream) {
  using T = StoreTiling<kHeadDim, kRowWarps>;
  const int64_t blocks = (args.rows + T::kRowsPerBlock - 1) / T::kRowsPerBlock;
  // CUDA sm_90+: a programmatic dependent of the previous kernel
  return launch_kernel(store_kernel<kHeadDim, kFmt, kIn, kRowWarps>,
                       {static_cast<unsigned>(blocks), static_cast<unsigned>(T::kThreads), 0, 1, kPdlLaunch}, stream,
                       args);
}

}  // namespace store

template <int kHeadDim, StoreFormat kFmt, RowDtype kIn>
gpuError_t StoreLaunch<kHeadDim, kFmt, kIn>::run(const StoreKernelArgs& args, gpuStream_t stream) {
  if (args.rows <= 0) return gpuSuccess;
  // wide teams for small launches, narrow ones for large launches: same bytes either way
  if (args.rows <= store::kWideRowsMax) {
    return store::launch_rows<kHeadDim, kFmt, kIn, store::kWideWarps<kHeadDim>>(args, stream);
  }
  return store::launch_rows<kHeadDim, kFmt, kIn, store::kNarrowWarps<kHeadDim>>(args, stream);
}

}  // namespace flashcompress
