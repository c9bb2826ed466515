// flashcompress: what a store (RMSNorm + RoPE (+ Hadamard) + quantised paged store) needs besides
// the row itself. Host-includable (no device code): the binding TU fills it, the kernels of the
// store family and the store epilogue of the compress family read it.
//
//   norm_weight  fp32 [H]        RMSNorm weight, already rounded to the row dtype by the caller
//                                (bf16 rows: bf16-rounded values widened to fp32)
//   norm_weight_bf16  bf16 bit patterns [H], or nullptr (default): when set, store_row reads
//                                the weight from here instead of norm_weight (bf16 rows whose
//                                weight is already bf16 need no widened copy)
//   norm_eps     fp32            as it crosses the C ABI (1e-6 -> 9.99999997e-7)
//   freq         fp32 [max_pos, 64]  view_as_real(freq_cis): row p = cos0, sin0, cos1, sin1, ...
//   cache        uint8 [pages, page_bytes]  (bf16 format: [rows, 1024 * page_size])
//   page_bytes   bytes per page: cache_page_bytes(format, page_size) (layout.h)
//   page_shift   log2(page_size)  (page size a power of two, a runtime value)
//
// A row with position p and destination slot loc is written at page = loc >> page_shift,
// slot = loc & (page_size - 1): data bytes at page * page_bytes + slot * data_bytes, scale bytes
// at page * page_bytes + page_size * data_bytes + slot * scale_bytes (layout.h); the interleaved
// V4.1 layouts (v41_new, v41_fp4_new): data at page * page_bytes + slot * bytes_per_token, the
// scales right after it.
#pragma once

#include <cstdint>

#include "layout.h"  // StoreFormat and the formats' byte sizes

namespace flashcompress {

struct StoreArgs {
  const float* norm_weight;
  const uint16_t* norm_weight_bf16 = nullptr;
  const float* freq;
  uint8_t* cache;
  int64_t page_bytes;
  int64_t freq_rows;
  float norm_eps;
  int32_t page_shift;
};

}  // namespace flashcompress
