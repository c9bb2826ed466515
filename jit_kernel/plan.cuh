// flashcompress: compressor plan rows (C++ mirror of python/flashcompress/layouts.py).
//
// Plain C++17: this header is included both by nvcc/hipcc (kernel TUs) and by the host compiler
// (tvm-ffi binding TUs), so it must not use CUDA-only syntax outside FC_HOST_DEVICE.
//
// All integers are little-endian. Plan tensors are uint8 [rows, sizeof(row)], contiguous, and
// every row is naturally aligned (alignment == size).
//
// DecodePlan, 16 B, one row per request:
//   0..3   u32 seq_len      sequence length including the current token
//   4..7   i32 write_loc    state row that receives the current token's input row
//   8..11  i32 read_page_0  state page of position max(seq_len-1-r, 0)
//   12..15 i32 read_page_1  state page of position seq_len-1
//   online C128: write_loc = read_page_0 = rid + state_slot_offset, read_page_1 = -1
//
// CompressPlan, 16 B, one row per compress event of a prefill:
//   0..3   u32 seq_len      event position + 1; 0xFFFFFFFF marks an invalid row
//   4..5   u16 ragged_id    row of the event token in the ragged input
//   6..7   u16 buffer_len   leading window entries (of W) read from the state buffer
//   8..11  i32 read_page_0  page of max(p-r, 0) if buffer_len > 0, else -1
//   12..15 i32 read_page_1  page of p if buffer_len > 0, else the batch index
//   invalid row bytes: FF FF FF FF 00 00 00 00 FF FF FF FF FF FF FF FF
//   online C128 (both lists use this layout): buffer_len = segment length,
//   read_page_0 = write slot (rid + state_slot_offset), read_page_1 = load slot (rid)
//
// WritePlan, 8 B, one row per token a prefill persists:
//   0..3   u32 ragged_id    stage 0: ragged_id | (batch << 16); final: ragged_id;
//                           0xFFFFFFFF marks an invalid row
//   4..7   i32 write_loc    stage 0: position + 1; final: destination state row (-1 invalid)
//   invalid row bytes: FF FF FF FF FF FF FF FF
//
// The second half of this file holds the launch-argument structs shared by the kernel TU and
// the binding TU of the `plan` JIT family (plain pointers and integers, no tvm-ffi types).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define FC_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FC_HOST_DEVICE inline
#endif

namespace flashcompress {

// ------------------------------------------------------------------------------------------
// Plan rows
// ------------------------------------------------------------------------------------------

struct alignas(16) DecodePlan {
  uint32_t seq_len;
  int32_t write_loc;
  int32_t read_page_0;
  int32_t read_page_1;
};

struct alignas(16) CompressPlan {
  uint32_t seq_len;
  uint16_t ragged_id;
  uint16_t buffer_len;
  int32_t read_page_0;
  int32_t read_page_1;
};

struct alignas(8) WritePlan {
  uint32_t ragged_id;
  int32_t write_loc;
};

inline constexpr uint32_t kInvalidU32 = 0xFFFFFFFFu;
inline constexpr int64_t kDecodePlanBytes = 16;
inline constexpr int64_t kCompressPlanBytes = 16;
inline constexpr int64_t kWritePlanBytes = 8;
// ragged ids are u16 and a stage-0 WritePlan packs the batch id into the upper 16 bits.
inline constexpr int64_t kMaxRaggedId = 65536;  // exclusive bound on ragged ids / num_q_tokens
inline constexpr int64_t kMaxBatch = 65535;     // exclusive-of-sentinel bound on batch ids

static_assert(sizeof(DecodePlan) == kDecodePlanBytes && alignof(DecodePlan) == 16, "DecodePlan");
static_assert(sizeof(CompressPlan) == kCompressPlanBytes && alignof(CompressPlan) == 16,
              "CompressPlan");
static_assert(sizeof(WritePlan) == kWritePlanBytes && alignof(WritePlan) == 8, "WritePlan");
static_assert(std::is_standard_layout_v<DecodePlan> && std::is_trivially_copyable_v<DecodePlan>);
static_assert(std::is_standard_layout_v<CompressPlan> &&
              std::is_trivially_copyable_v<CompressPlan>);
static_assert(std::is_standard_layout_v<WritePlan> && std::is_trivially_copyable_v<WritePlan>);
static_assert(offsetof(DecodePlan, seq_len) == 0 && offsetof(DecodePlan, write_loc) == 4 &&
                  offsetof(DecodePlan, read_page_0) == 8 &&
                  offsetof(DecodePlan, read_page_1) == 12,
              "DecodePlan field offsets must match layouts.DECODE_PLAN");
static_assert(offsetof(CompressPlan, seq_len) == 0 && offsetof(CompressPlan, ragged_id) == 4 &&
                  offsetof(CompressPlan, buffer_len) == 6 &&
                  offsetof(CompressPlan, read_page_0) == 8 &&
                  offsetof(CompressPlan, read_page_1) == 12,
              "CompressPlan field offsets must match layouts.COMPRESS_PLAN");
static_assert(offsetof(WritePlan, ragged_id) == 0 && offsetof(WritePlan, write_loc) == 4,
              "WritePlan field offsets must match layouts.WRITE_PLAN");

// Sentinel rows (layouts.INVALID_COMPRESS_ROW / INVALID_WRITE_ROW). Functions rather than
// constexpr objects so that device code can use them without relaxed-constexpr flags.
FC_HOST_DEVICE CompressPlan invalid_compress_plan() {
  CompressPlan row;
  row.seq_len = kInvalidU32;
  row.ragged_id = 0;
  row.buffer_len = 0;
  row.read_page_0 = -1;
  row.read_page_1 = -1;
  return row;
}

FC_HOST_DEVICE WritePlan invalid_write_plan() {
  WritePlan row;
  row.ragged_id = kInvalidU32;
  row.write_loc = -1;
  return row;
}

// Window size: tokens pooled into one compressed entry (2r with overlap for r = 4).
FC_HOST_DEVICE constexpr int64_t window_size(int64_t ratio) { return ratio == 4 ? 8 : ratio; }

// Trailing tokens a prefill keeps resident for speculative decoding (layouts.mtp_write_pad).
FC_HOST_DEVICE constexpr int64_t mtp_write_pad(int64_t ratio, int64_t ring_size) {
  return ring_size > window_size(ratio) ? ring_size - window_size(ratio) + 2 : 0;
}

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

// Regular decode: out[b] for b < batch.
struct DecodeArgs {
  DecodePlan* out;                // [batch]
  const int64_t* req_pool_indices;  // [batch]
  const int64_t* seq_lens;          // [batch]
  int64_t batch;
  StateAddressing addr;
};

// Online C128 decode.
struct OnlineDecodeArgs {
  DecodePlan* out;                  // [batch]
  const int64_t* req_pool_indices;  // [batch]
  const int64_t* seq_lens;          // [batch]
  int64_t batch;
  int64_t state_slot_offset;
};

// Prefill stage 1 over CPU-built stage-0 rows. Rows [0, num_c) of plan_c hold stage-0 rows;
// rows [num_c, rows_c) are written as sentinels (likewise for plan_w).
struct PrefillStage1Args {
  CompressPlan* plan_c;  // [rows_c]
  WritePlan* plan_w;     // [rows_w]
  int64_t rows_c, num_c;
  int64_t rows_w, num_w;
  const int64_t* req_pool_indices;  // [batch]
  int64_t batch;
  StateAddressing addr;
};

// Online prefill stage 1; both lists use the CompressPlan layout.
struct OnlinePrefillStage1Args {
  CompressPlan* plan_c;  // [rows_c]
  CompressPlan* plan_w;  // [rows_w]
  int64_t rows_c, num_c;
  int64_t rows_w, num_w;
  const int64_t* req_pool_indices;  // [batch]
  int64_t batch;
  int64_t state_slot_offset;
};

// Whole prefill plan from device seq_lens / extend_lens (CUDA-graph path). Both lists have
// num_rows rows. workspace holds 3 * (batch + 1) int64: exclusive prefix sums over requests of
// the token, compress-row and write-row counts (each followed by its total).
struct PrefillDeviceArgs {
  CompressPlan* plan_c;  // [num_rows]
  WritePlan* plan_w;     // [num_rows]
  int64_t num_rows;
  int64_t* workspace;               // [3 * (batch + 1)]
  const int64_t* req_pool_indices;  // [batch]
  const int64_t* seq_lens;          // [batch]
  const int64_t* extend_lens;       // [batch]
  int64_t batch;
  StateAddressing addr;
};

struct OnlinePrefillDeviceArgs {
  CompressPlan* plan_c;  // [num_rows]
  CompressPlan* plan_w;  // [num_rows]
  int64_t num_rows;
  int64_t* workspace;               // [3 * (batch + 1)]
  const int64_t* req_pool_indices;  // [batch]
  const int64_t* seq_lens;          // [batch]
  const int64_t* extend_lens;       // [batch]
  int64_t batch;
  int64_t state_slot_offset;
};

// Number of int64 workspace entries the device prefill planners need.
FC_HOST_DEVICE constexpr int64_t prefill_workspace_size(int64_t batch) { return 3 * (batch + 1); }

}  // namespace flashcompress
