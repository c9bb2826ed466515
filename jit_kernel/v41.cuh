// flashcompress: the DeepSeek-V4.1 low-ratio compressor ops (spec v41.md §3-§5, §7) as CUDA
// kernels. Device code; included by the kernel TU of the `v41` family only. The byte-exact
// reference is python/flashcompress/torch_backend/v41.py (+ v41_quant.py).
//
// Ops (V41Launch<kOp, kLayout, kDesign>::run, args in v41_launch.h; base design: grids of
// 256-thread blocks, as below; the fast designs: v41_fast.cuh). Shared row helpers: v41_common.cuh.
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
// Every kernel waits on griddepcontrol before its first global read (FC_ENABLE_PDL launches), but
// the c2 prefill write-back, which loads before its wait what the pool pass does not write; each
// lets the next kernel of the stream launch right after its wait (the next kernel's own wait still
// waits for this grid to finish). No host synchronisation; graph-capturable.
#pragma once

#include <cstdint>

#include "arch.cuh"
#include "gpu_runtime.h"
#include "launch.h"
#include "ptx.cuh"
#include "quant.cuh"
#include "v41_common.cuh"
#include "v41_fast.cuh"
#include "v41_launch.h"

namespace flashcompress {
namespace v41 {

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

// Prefill write-back: warp (b, k) copies row start_b + len_b - 1 - k (k < min(len_b, ring), not
// padded) to its ring row. Launched after the pool pass, whose ring reads it must not overtake:
// the warp loads the metadata and the row before its wait (the pool pass writes neither, and it
// lets this grid launch only after its own wait, so what earlier kernels wrote is visible) and
// stores after it, so only the row's store is left when the pool pass completes.
template <int kWarpsPerBlock>
__global__ void __launch_bounds__(kThreads) c2_writeback_kernel(const V41Args a) {
  const int lane = threadIdx.x & 31;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  bool copy = false;
  int64_t dst = 0;
  float4 v[8];
  if (item < a.batch * a.ring_size) {
    const int64_t b = item / a.ring_size, k = item % a.ring_size;
    const int64_t len = a.extend_len[b], start = a.extend_start[b];
    const int64_t row = start + len - 1 - k;
    if (k < len && row >= 0 && row < a.rows) {
      const int64_t loc = load_index(a.loc, a.loc_i64, row);
      const int64_t pos = load_index(a.positions, a.positions_i64, row);
      const int64_t rid = a.req[row];
      const float* src = static_cast<const float*>(a.input) + row * kStateWidth;
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = *reinterpret_cast<const float4*>(src + 128 * j + 4 * lane);
      copy = loc != 0;
      dst = ring_row(rid, pos, 0, a.ring_size) * kStateWidth;
    }
  }
  pdl_enter<true>();  // every ring read of the pool pass precedes these stores
  if (!copy) return;
#pragma unroll
  for (int j = 0; j < 8; ++j) *reinterpret_cast<float4*>(a.state + dst + 128 * j + 4 * lane) = v[j];
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

}  // namespace v41

template <V41Op kOp, V41Layout kLayout, V41Design kDesign>
gpuError_t V41Launch<kOp, kLayout, kDesign>::run(const V41Args& args, gpuStream_t stream) {
  const auto blocks = [](int64_t items, int per_block) { return static_cast<unsigned>((items + per_block - 1) / per_block); };
  if constexpr (kDesign != V41Design::kBase && kOp != V41Op::kIndexK) {
    // the row arithmetic of the fast kernels: fast3's, or fast's (fast, fast2)
    constexpr V41Design kArith = kDesign == V41Design::kFast3 ? V41Design::kFast3 : V41Design::kFast;
    const bool decode = args.rows <= v41::kFastDecodeRowsMax;
    if constexpr ((kDesign == V41Design::kFast2 || kDesign == V41Design::kFast3) && kOp != V41Op::kC2Prefill) {
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
      return decode ? launch_kernel(v41::c1_fast_kernel<kLayout, true, kArith>, rows, stream, args)
                    : launch_kernel(v41::c1_fast_kernel<kLayout, false, kArith>, rows, stream, args);
    } else if constexpr (kOp == V41Op::kC2Decode) {
      return decode ? launch_kernel(v41::c2_fast_kernel<kLayout, true, kArith>, rows, stream, args)
                    : launch_kernel(v41::c2_fast_kernel<kLayout, false, kArith>, rows, stream, args);
    } else {
      const int64_t pairs = (args.rows + 1) / 2;
      const int pair_warps = pairs <= v41::kFastDecodeRowsMax ? 1 : v41::kFastWideWarps;
      const LaunchConfig pool{blocks(pairs, pair_warps), static_cast<unsigned>(32 * pair_warps), 0, 1, kPdlLaunch};
      const gpuError_t e = launch_kernel(v41::c2_prefill_fast_kernel<kLayout, kArith>, pool, stream, args);
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
