// flashcompress: launch interface of the `store` family (host-includable, no device code).
//
// The binding TU (templates/store_binding.cpp.j2, checks in store_binding.h) fills a
// StoreKernelArgs and calls StoreLaunch<...>::run; the kernel TU (templates/store_kernel.cu.j2)
// is one explicit instantiation of the struct, defined in store.cuh.
//
// StoreKernelArgs (all device pointers, one GPU):
//   kv        [rows, H]  fp32 or bf16 (RowDtype), contiguous, 16-byte (fp32) / 8-byte (bf16)
//                        aligned rows; row n is the input of plan row n
//   plan      [rows, 16] DecodePlan (is_decode) or CompressPlan rows (plan.cuh)
//   out_loc   int64      decode: [rows]; prefill: indexed by ragged_id
//   rows      plan rows (0: nothing is launched)
//   ratio     compress ratio, a power of two (row stored iff seq_len % ratio == 0 in decode; position
//             seq_len - ratio)
//   store     norm weight, eps, RoPE table, cache and its paging (store_args.h)
#pragma once

#include <cstdint>

#include "gpu_runtime.h"
#include "store_args.h"

namespace flashcompress {

// Element type of the kv rows the standalone store reads.
enum class RowDtype : int { kF32 = 0, kBF16 = 1 };

struct StoreKernelArgs {
  const void* kv;
  const uint8_t* plan;
  const int64_t* out_loc;
  int64_t rows;
  uint32_t ratio;
  bool is_decode;
  StoreArgs store;
};

template <int kHeadDim, StoreFormat kFmt, RowDtype kIn>
struct StoreLaunch {
  // One warp per plan row, several rows per block, on `stream`; no host synchronisation.
  static gpuError_t run(const StoreKernelArgs& args, gpuStream_t stream);
};

}  // namespace flashcompress
