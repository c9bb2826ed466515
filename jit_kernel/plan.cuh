// flashcompress: launch arguments of the `plan` JIT family, shared by its kernel TU and its
// binding TU (plain pointers and integers, no tvm-ffi types; host-includable C++17). The plan
// rows themselves and their sentinels live in layout.h.
//
// Each argument struct is a template over kOnline: the regular variants address the state pool
// through StateAddressing (request ring or paged tables), online C128 through
// OnlineAddressing (one slot per request). Everything else is the same.
#pragma once

#include <cstdint>
#include <type_traits>

#include "layout.h"

namespace flashcompress {

// ------------------------------------------------------------------------------------------
// Launch arguments of the `plan` family (kernel TU <-> binding TU)
// ------------------------------------------------------------------------------------------

// How (request slot rid, position p) maps to a state row (spec/compressor.md §2.3).
//   req_ring: row = rid * ring_size + p % ring_size
//   paged:    swa = full_to_state[req_to_token[rid * req_to_token_stride + p]]
//             row = (swa / swa_page_size) * ring_size + swa % ring_size
// Division and remainder truncate (C semantics), like the PyTorch backend.
struct StateAddressing {
  const int32_t* req_to_token;  // [R, L] int32, row stride req_to_token_stride (paged only)
  int64_t req_to_token_stride;
  const int64_t* full_to_state;  // [F] int64 (paged only)
  int64_t swa_page_size;
  int64_t ring_size;
  bool req_ring;
};

// Online C128: request slot rid owns state slot rid + state_slot_offset.
struct OnlineAddressing {
  int64_t state_slot_offset;
};

template <bool kOnline>
using AddressingOf = std::conditional_t<kOnline, OnlineAddressing, StateAddressing>;
// The write list's rows: WritePlan, or CompressPlan for online C128 (layout.h).
template <bool kOnline>
using WriteRowOf = std::conditional_t<kOnline, CompressPlan, WritePlan>;

// Decode: out[b] for b < batch.
template <bool kOnline>
struct DecodeArgsOf {
  DecodePlan* out;                  // [batch]
  const int64_t* req_pool_indices;  // [batch]
  const int64_t* seq_lens;          // [batch]
  int64_t batch;
  AddressingOf<kOnline> addr;
};

// Prefill stage 1 over CPU-built stage-0 rows. Rows [0, num_c) of plan_c hold stage-0 rows;
// rows [num_c, rows_c) are written as sentinels (likewise for plan_w).
template <bool kOnline>
struct Stage1ArgsOf {
  CompressPlan* plan_c;         // [rows_c]
  WriteRowOf<kOnline>* plan_w;  // [rows_w]
  int64_t rows_c, num_c;
  int64_t rows_w, num_w;
  const int64_t* req_pool_indices;  // [batch]
  int64_t batch;
  AddressingOf<kOnline> addr;
};

// Whole prefill plan from device seq_lens / extend_lens (CUDA-graph path). Both lists have
// num_rows rows. workspace holds 3 * (batch + 1) int64: exclusive prefix sums over requests of
// the token, compress-row and write-row counts (each followed by its total).
template <bool kOnline>
struct DeviceArgsOf {
  CompressPlan* plan_c;         // [num_rows]
  WriteRowOf<kOnline>* plan_w;  // [num_rows]
  int64_t num_rows;
  int64_t* workspace;               // [3 * (batch + 1)]
  const int64_t* req_pool_indices;  // [batch]
  const int64_t* seq_lens;          // [batch]
  const int64_t* extend_lens;       // [batch]
  int64_t batch;
  AddressingOf<kOnline> addr;
};

using DecodeArgs = DecodeArgsOf<false>;
using OnlineDecodeArgs = DecodeArgsOf<true>;
using PrefillStage1Args = Stage1ArgsOf<false>;
using OnlinePrefillStage1Args = Stage1ArgsOf<true>;
using PrefillDeviceArgs = DeviceArgsOf<false>;
using OnlinePrefillDeviceArgs = DeviceArgsOf<true>;

// Number of int64 workspace entries the device prefill planners need.
FC_HOST_DEVICE constexpr int64_t prefill_workspace_size(int64_t batch) { return 3 * (batch + 1); }

}  // namespace flashcompress
