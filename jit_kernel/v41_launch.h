// flashcompress: launch interface of the `v41` family (host-includable, no device code).
//
// The binding TU (templates/v41_binding.cpp.j2, checks in v41_binding.h) fills one of the
// argument structs below and calls V41Launch<kOp, kLayout, kDesign>::run; the kernel TU
// (templates/v41_kernel.cu.j2) is one explicit instantiation, defined in v41.cuh.
//
// Index tensors (positions, out_loc / raw_out_loc) are int32 or int64 (`*_i64` says which);
// req and the index-K loc are int64, extend_start_loc / extend_seq_lens int32.
#pragma once

#include <cstdint>

#include "gpu_runtime.h"

namespace flashcompress {

enum class V41Op : int { kC1 = 0, kC2Decode = 1, kC2Prefill = 2, kIndexK = 3 };

// C++ values of KVLayout (python/flashcompress/v41/layouts.py); kNone: the index-K op.
enum class V41Layout : int { kV4 = 0, kV41 = 1, kV41Fp4 = 2, kUniformFp8 = 3, kV41New = 4, kV41Fp4New = 5, kNone = -1 };

// Byte geometry of a layout's page (the binding computes it from the layout and the page size).
struct V41Paging {
  uint8_t* cache;        // [pages, page_bytes]
  int64_t page_bytes;
  int64_t data_stride;   // slot s's data at page * page_bytes + s * data_stride
  int64_t scale_base;    // slot s's scales at page * page_bytes + scale_base + s * scale_stride
  int64_t scale_stride;
  int32_t page_shift;    // log2(page size)
};

struct V41Args {
  // c1: bf16 [rows, 512]; c2: fp32 [rows, 1024] (kv | score); index-K: bf16 [rows, 128]
  const void* input;
  float* state;              // c2: fp32 [state_rows, 1024] pair ring
  const uint16_t* norm_weight;  // bf16 [512] / [128]
  const float* freq;         // fp32 [table rows, 64]
  const void* positions;     // [rows]
  const void* loc;           // c1 out_loc / c2 raw_out_loc / index-K loc, [rows]
  const int64_t* req;        // c2: [rows]
  const int32_t* extend_start;  // c2 prefill: [batch]
  const int32_t* extend_len;    // c2 prefill: [batch]
  uint16_t* out;             // bf16 [rows, 512] latent (c1, c2)
  V41Paging paging;
  int64_t rows;
  int64_t batch;             // c2 prefill requests
  int64_t ring_size;         // c2
  int64_t draft_len;         // c2 decode (1) / verify (> 1)
  int32_t ratio;             // index-K: 1 or 2
  float eps;
  bool positions_i64;
  bool loc_i64;
};

// Kernel design (the family's `design` parameter): kBase, the first kernels (8 rows per block);
// kFast, latency-first loads, launch-size-dependent blocks and division-free quantisation
// (v41.cuh, "Fast design"); kFast2, kFast with two warps per row for decode-sized c1 and c2 decode launches;
// kFast3, kFast2 with fewer instructions per row in the wide c1 / c2 kernels (v41_fast3.cuh).
// Index-K has one design.
enum class V41Design : int { kBase = 0, kFast = 1, kFast2 = 2, kFast3 = 3 };

template <V41Op kOp, V41Layout kLayout, V41Design kDesign>
struct V41Launch {
  // One launch (c2 prefill: two, the pool pass then the ring write-back) on `stream`.
  static gpuError_t run(const V41Args& args, gpuStream_t stream);
};

}  // namespace flashcompress
