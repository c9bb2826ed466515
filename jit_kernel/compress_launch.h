// flashcompress: launch interface of the `compress` family (host-includable, no device code).
//
// The binding TU (templates/compress_binding.cpp.j2, checks in compress_binding.h) fills a
// CompressArgs and calls CompressLaunch<...>::run; the kernel TU (templates/compress_kernel.cu.j2)
// is one explicit instantiation of that struct, defined in compress.cuh.
//
// A variant is (ratio, online, head_dim, input / state / output dtype, store format, tiling):
//   kFmt == StoreFormat::kNone   compress_forward: compressed rows go to `out` [plan rows, H]
//   any other kFmt              compress_and_store: each compressed row is rounded to the output
//                                dtype, then RMSNorm + RoPE (+ Hadamard) + quantised store into
//                                the paged cache (store_args.h); `out` is unused.
#pragma once

#include <cstdint>

#include "gpu_runtime.h"
#include "store_args.h"

namespace flashcompress {

// Element types of the compress tensors (the kernel header maps them to C++ types).
enum class DType : int { kF32 = 0, kBF16 = 1 };

// How a C128 row is split over blocks: kAuto uses thread block clusters where the target has
// them (sm_90+: 8 / 4 blocks per row), kWholeRow pools every row in one 512-thread block (what
// targets without clusters always do); kAuto's C128 decode of more than 128 requests is one grid
// where only window-closing requests pool and the other requests' row copies are spread over
// all blocks (compress_decode_closing.cuh). kClosing is kAuto with that grid at every batch size.
enum class Tiling : int { kAuto = 0, kWholeRow = 1, kClosing = 2 };

struct CompressArgs {
  void* state;              // flat state pool [state_rows, width], TState
  const void* input;        // kv_score_input [input_rows, 2H (C128) | 4H (C4)], TIn
  const void* ape;          // [8 | 128, H], TIn
  const uint8_t* plan;      // decode: DecodePlan [rows]; prefill: CompressPlan [rows]
  const uint8_t* plan_w;    // prefill: WritePlan [rows_w] (online: CompressPlan [rows_w])
  void* out;                // kNone: [rows, H], TOut
  const int64_t* out_loc;   // store: decode [rows], prefill [>= max ragged_id + 1]
  int64_t rows;             // plan rows (decode: batch)
  int64_t rows_w;           // write-list rows (prefill only)
  int64_t state_rows;
  int64_t input_rows;
  int64_t reqs_per_team;    // decode: requests per team (set by the launcher)
  bool is_decode;
  StoreArgs store;          // store variants only
};

template <int kRatio, bool kOnline, int kHeadDim, DType kIn, DType kState, DType kOut,
          StoreFormat kFmt, Tiling kTiling>
struct CompressLaunch {
  // Launches the decode kernel, or the prefill compress pass then the write pass, on `stream`.
  static gpuError_t run(const CompressArgs& args, gpuStream_t stream);
};

}  // namespace flashcompress
