// flashcompress: the `compress` kernel family: softmax pooling of KV windows into compressed
// rows (compress_forward), optionally ending in the store epilogue (compress_and_store). This
// header is the launcher (CompressLaunch::run, compress_launch.h); the pieces, by role:
//   compress_config.cuh    Cfg: types, widths, tiling       compress_pool.cuh      pooling, row pipeline
//   compress_epilogue.cuh  store epilogue                   compress_decode.cuh    online / whole-row decode
//   compress_decode_c4.cuh C4 decode kernel                 compress_decode_c128.cuh  C128 decode (clusters)
//   compress_prefill.cuh   prefill passes 1 and 2      compress_decode_closing.cuh  C128 decode, Tiling::kClosing
//   (design notes: docs/kernel-design.md)
//
// Tensors (H = head dim, W = window = 8 for ratio 4 / 128 for ratio 128; all contiguous):
//   state   [state_rows, width] TState  C4: width 4H, a raw copy of a token's input row;
//                                       C128: 2H; online C128: 3H = [max M | sum S | mean K]
//   input   [input_rows, 4H | 2H] TIn   C4 columns kv-overlap, kv-own, score-overlap, score-own;
//                                       C128 / online: kv, score
//   ape     [8 | 128, H] TIn            C4 rows 0-3 overlap bias, 4-7 own bias; C128 row = offset
//   plan    decode: DecodePlan [B] (16 B); prefill: CompressPlan [C] (16 B)
//   plan_w  prefill: WritePlan [Nw] (8 B); online: CompressPlan [Nw] (segment rows)
//   out     [rows, H] TOut (kFmt == kNone): decode row b = request b, zeros unless it closes a
//           window; prefill row k = plan row k, zeros for invalid rows
//   store   (kFmt != kNone) the compressed row, rounded to TOut, is stored at RoPE position
//           seq_len - ratio, slot out_loc[b] (decode) or out_loc[ragged_id] (prefill); rows
//           that close no window write nothing.
// Window entries: C4 e < 4 (overlap) kv [0,H), score [2H,3H), state row 4*page0 + e, input row
// q - 7 + e, padding while seq_len <= 4; C4 e >= 4 (own) kv [H,2H), score [3H,4H), state row
// 4*page1 + e - 4, input row q - 3 + (e - 4); C128 e: kv [0,H), score [H,2H), state row
// 128*page1 + e, input row q - 127 + e.
// Launches: decode is one kernel; prefill is pass 1 then pass 2; on sm_90 each is a programmatic
// dependent of the kernel before it in the stream.
#pragma once

#include <cstdint>

#include "compress_config.cuh"
#include "compress_decode.cuh"
#include "compress_decode_c128.cuh"
#include "compress_decode_c4.cuh"
#include "compress_decode_closing.cuh"
#include "compress_launch.h"
#include "compress_prefill.cuh"
#include "gpu_runtime.h"
#include "launch.h"

namespace flashcompress {

namespace compress {

template <class C>
unsigned row_grid(int64_t rows, int64_t rows_per_team) {
  const int64_t per = C::kTeams * rows_per_team;
  return static_cast<unsigned>((rows + per - 1) / per * C::kCSplit);
}

}  // namespace compress

template <int kRatio, bool kOnline, int kHeadDim, DType kIn, DType kState, DType kOut,
          StoreFormat kFmt, Tiling kTiling>
gpuError_t CompressLaunch<kRatio, kOnline, kHeadDim, kIn, kState, kOut, kFmt, kTiling>::run(
    const CompressArgs& a, gpuStream_t stream) {
  using namespace compress;
  if (a.is_decode) {
    using C = Cfg<kRatio, kOnline, kHeadDim, kIn, kState, kOut, kFmt, kTiling, Pass::kDecode>;
    if constexpr (kRatio == 4) {
      return launch_decode_c4<C>(a, stream);
    } else {
      // C128 (clusters available), small batches: one block per (request, 64-channel slice);
      // larger batches: one wave of blocks that pool only the closing requests and spread the
      // other requests' row copies over the grid (Tiling::kClosing: that kernel at every batch
      // size). Online C128 and the whole-row tiling: teams that walk as many requests as make
      // the grid one wave of resident blocks.
      if constexpr (kC128Burst<C>) {
        if (!C::kClosingTiling && a.rows <= kC128BurstMaxRows) return launch_decode_c128<C>(a, stream);
      }
      if constexpr (kC128Closing<C>) {
        return launch_decode_closing<C>(a, stream);
      } else {
        constexpr unsigned kCluster = C::kCluster ? C::kCSplit : 1;
        const int64_t resident = KernelOccupancy<decode_kernel<C>>::resident(C::kThreads, kCluster);
        if (resident <= 0) return static_cast<gpuError_t>(-resident);
        const int64_t teams = resident / C::kCSplit * C::kTeams;
        CompressArgs d = a;
        d.reqs_per_team = teams > 0 ? (a.rows + teams - 1) / teams : 1;
        return launch_kernel(decode_kernel<C>, {row_grid<C>(a.rows, d.reqs_per_team), C::kThreads, 0, kCluster,
                                                kPdlLaunch}, stream, d);
      }
    }
  }
  using C = Cfg<kRatio, kOnline, kHeadDim, kIn, kState, kOut, kFmt, kTiling, Pass::kPrefill>;
  constexpr unsigned kCluster = C::kCluster ? C::kCSplit : 1;
  gpuError_t err = launch_kernel(prefill_kernel<C>, {row_grid<C>(a.rows, 1), C::kThreads, 0, kCluster, kPdlLaunch},
                                 stream, a);
  if (err != gpuSuccess) return err;
  if constexpr (kOnline) {
    using CW = Cfg<kRatio, kOnline, kHeadDim, kIn, kState, kOut, kFmt, kTiling, Pass::kOnlineWrite>;
    return launch_kernel(prefill_kernel<CW>, {row_grid<CW>(a.rows_w, 1), CW::kThreads, 0, 1, kPdlLaunch}, stream, a);
  } else {
    return launch_kernel(write_kernel<C>, {static_cast<unsigned>((a.rows_w + 7) / 8), 256, 0, 1, kPdlLaunch}, stream,
                         a);
  }
}

}  // namespace flashcompress
