// flashcompress: the byte layouts and tensor widths every family shares -- cache-format entries,
// the widths of each compressor layer kind, plan rows. The one C++ home of these facts; the
// Python home is python/flashcompress/layouts.py, and tests/test_layouts.py compiles this header
// on the host and checks that the two agree.
//
// Plain constexpr C++17 without GPU headers: kernel TUs (nvcc / hipcc), binding TUs and host test
// programs include it alike. Functions device code calls are FC_HOST_DEVICE.
//
// Cache formats (spec store-and-jit.md §5-§6), bytes per token. A page holds the data entries of
// its page_size tokens, then their scale entries, padded to a multiple of page_align bytes:
//   format    head_dim  data  scale  page_align  page bytes (P = page_size)
//   v4        512       576   8      576         ceil(584 P / 576) * 576
//   idx_fp8   128       128   4      1           132 P
//   idx_fp4   128       64    4      1           68 P
//   bf16      512       1024  0      1           1024 P  (P dense rows of 1024 B)
// The V4.1 main-KV layouts (KVLayout, python/flashcompress/v41/layouts.py; the store's layout=):
//   v41          512       512   16     512         ceil(528 P / 512) * 512
//   v41_fp4      512       256   32     256         ceil(288 P / 256) * 256
//   uniform_fp8  512       512   0      512         512 P
//   v41_new      512       512   16     528         528 P  (interleaved: a token's scales follow
//   v41_fp4_new  512       256   32     288         288 P   its data, no page-level scale region)
//
// Layer kinds (spec compressor.md §1.7): (ratio, head dim H, online) -> tensor widths
//   input row  [kv | score]: 4H for C4 (doubled by the overlap), 2H for C128
//   state row  the input row, or 3H for online C128
//   ape rows   the window: 8 for C4, 128 for C128
//
// Plan rows. All integers are little-endian; plan tensors are uint8 [rows, sizeof(row)],
// contiguous, every row naturally aligned (alignment == size).
//   DecodePlan, 16 B, one row per request:
//     0..3   u32 seq_len      sequence length including the current token
//     4..7   i32 write_loc    state row that receives the current token's input row
//     8..11  i32 read_page_0  state page of position max(seq_len-1-r, 0)
//     12..15 i32 read_page_1  state page of position seq_len-1
//     online C128: write_loc = read_page_0 = rid + state_slot_offset, read_page_1 = -1
//   CompressPlan, 16 B, one row per compress event of a prefill:
//     0..3   u32 seq_len      event position + 1; 0xFFFFFFFF marks an invalid row
//     4..5   u16 ragged_id    row of the event token in the ragged input
//     6..7   u16 buffer_len   leading window entries (of W) read from the state buffer
//     8..11  i32 read_page_0  page of max(p-r, 0) if buffer_len > 0, else -1
//     12..15 i32 read_page_1  page of p if buffer_len > 0, else the batch index
//     invalid row bytes: FF FF FF FF 00 00 00 00 FF FF FF FF FF FF FF FF
//     online C128 (both lists use this layout): buffer_len = segment length,
//     read_page_0 = write slot (rid + state_slot_offset), read_page_1 = load slot (rid)
//   WritePlan, 8 B, one row per token a prefill persists:
//     0..3   u32 ragged_id    stage 0: ragged_id | (batch << 16); final: ragged_id;
//                             0xFFFFFFFF marks an invalid row
//     4..7   i32 write_loc    stage 0: position + 1; final: destination state row (-1 invalid)
//     invalid row bytes: FF FF FF FF FF FF FF FF
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
// Cache formats
// ------------------------------------------------------------------------------------------

// The cache a row is stored into. kNone: no store (compress_forward's plain output). kV41 ..
// kV41Fp4New: the V4.1 layouts (written by the store family only).
enum class StoreFormat : int {
  kNone = 0, kV4 = 1, kIndexFp8 = 2, kIndexFp4 = 3, kBf16 = 4,
  kV41 = 5, kV41Fp4 = 6, kUniformFp8 = 7, kV41New = 8, kV41Fp4New = 9
};

struct CacheFormatBytes {
  const char* name;  // layouts.CacheFormat.name
  int64_t head_dim;
  int64_t data_bytes;   // per token, in the page's data region
  int64_t scale_bytes;  // per token, in the page's scale region after the data
  int64_t page_align;   // a page is padded to a multiple of this
  bool interleaved = false;  // a token's scales right after its data (page_align = bytes per token)
};

FC_HOST_DEVICE constexpr CacheFormatBytes cache_format(StoreFormat fmt) {
  switch (fmt) {
    case StoreFormat::kV4: return {"v4", 512, 576, 8, 576};
    case StoreFormat::kIndexFp8: return {"idx_fp8", 128, 128, 4, 1};
    case StoreFormat::kIndexFp4: return {"idx_fp4", 128, 64, 4, 1};
    case StoreFormat::kBf16: return {"bf16", 512, 1024, 0, 1};
    case StoreFormat::kV41: return {"v41", 512, 512, 16, 512};
    case StoreFormat::kV41Fp4: return {"v41_fp4", 512, 256, 32, 256};
    case StoreFormat::kUniformFp8: return {"uniform_fp8", 512, 512, 0, 512};
    case StoreFormat::kV41New: return {"v41_new", 512, 512, 16, 528, true};
    case StoreFormat::kV41Fp4New: return {"v41_fp4_new", 512, 256, 32, 288, true};
    default: return {"none", 0, 0, 0, 1};
  }
}

// The formats a store writes, in layouts.CACHE_FORMATS order.
inline constexpr StoreFormat kCacheFormats[] = {StoreFormat::kV4,         StoreFormat::kIndexFp8,
                                                StoreFormat::kIndexFp4,   StoreFormat::kBf16,
                                                StoreFormat::kV41,        StoreFormat::kV41Fp4,
                                                StoreFormat::kUniformFp8, StoreFormat::kV41New,
                                                StoreFormat::kV41Fp4New};

// The V4.1 layouts (KVLayout values other than v4): quantise the fp32 row without the V4 bf16
// round trip; bf16 rows are rounded to bf16 around the RoPE (the peer's rounding to the row dtype).
FC_HOST_DEVICE constexpr bool is_v41_layout(StoreFormat fmt) {
  return fmt == StoreFormat::kV41 || fmt == StoreFormat::kV41Fp4 || fmt == StoreFormat::kUniformFp8 ||
         fmt == StoreFormat::kV41New || fmt == StoreFormat::kV41Fp4New;
}

// Bytes of one page of page_size tokens: one row of the kvcache tensor.
FC_HOST_DEVICE constexpr int64_t cache_page_bytes(StoreFormat fmt, int64_t page_size) {
  const CacheFormatBytes f = cache_format(fmt);
  const int64_t raw = page_size * (f.data_bytes + f.scale_bytes);
  return (raw + f.page_align - 1) / f.page_align * f.page_align;
}

static_assert(cache_page_bytes(StoreFormat::kV4, 64) == 37440 && cache_page_bytes(StoreFormat::kV4, 2) == 1728 &&
                  cache_page_bytes(StoreFormat::kV4, 1) == 1152,
              "V4 pages: ceil(584 P / 576) * 576 (spec §5.1)");
static_assert(cache_page_bytes(StoreFormat::kIndexFp8, 64) == 8448 &&
                  cache_page_bytes(StoreFormat::kIndexFp4, 64) == 4352,
              "indexer pages: 132 P and 68 P (spec §6.4)");
static_assert(cache_page_bytes(StoreFormat::kV41, 64) == 33792 && cache_page_bytes(StoreFormat::kV41Fp4, 2) == 768 &&
                  cache_page_bytes(StoreFormat::kV41New, 2) == 1056 &&
                  cache_page_bytes(StoreFormat::kV41Fp4New, 64) == 18432 &&
                  cache_page_bytes(StoreFormat::kUniformFp8, 2) == 1024,
              "V4.1 pages (spec v41.md §7.2)");

// ------------------------------------------------------------------------------------------
// Layer kinds
// ------------------------------------------------------------------------------------------

// Window size: tokens pooled into one compressed entry (2r with overlap for r = 4).
FC_HOST_DEVICE constexpr int64_t window_size(int64_t ratio) { return ratio == 4 ? 8 : ratio; }

// Last dim of kv_score_input: [kv | score], doubled for the C4 overlap.
FC_HOST_DEVICE constexpr int64_t input_width(int64_t ratio, int64_t head_dim) {
  return (ratio == 4 ? 4 : 2) * head_dim;
}

// Last dim of one state-pool row.
FC_HOST_DEVICE constexpr int64_t state_width(int64_t ratio, int64_t head_dim, bool online) {
  return online ? 3 * head_dim : input_width(ratio, head_dim);
}

// Rows of ape (the positional bias): one per window entry.
FC_HOST_DEVICE constexpr int64_t ape_rows(int64_t ratio) { return window_size(ratio); }

struct LayerKind {
  int64_t ratio;
  int64_t head_dim;
  bool online;
};

// Every supported (ratio, head_dim, online), in layouts.LAYER_KINDS order.
inline constexpr LayerKind kLayerKinds[] = {{4, 128, false}, {4, 512, false}, {128, 512, false}, {128, 512, true}};

constexpr bool is_layer_kind(int64_t ratio, int64_t head_dim, bool online) {
  for (const LayerKind& k : kLayerKinds) {
    if (k.ratio == ratio && k.head_dim == head_dim && k.online == online) return true;
  }
  return false;
}

// Trailing tokens a prefill keeps resident for speculative decoding (layouts.mtp_write_pad).
FC_HOST_DEVICE constexpr int64_t mtp_write_pad(int64_t ratio, int64_t ring_size) {
  return ring_size > window_size(ratio) ? ring_size - window_size(ratio) + 2 : 0;
}

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

// Bytes of a prefill's write-list row: WritePlan, or CompressPlan for online C128.
FC_HOST_DEVICE constexpr int64_t write_row_bytes(bool online) { return online ? kCompressPlanBytes : kWritePlanBytes; }

static_assert(sizeof(DecodePlan) == kDecodePlanBytes && alignof(DecodePlan) == 16, "DecodePlan");
static_assert(sizeof(CompressPlan) == kCompressPlanBytes && alignof(CompressPlan) == 16, "CompressPlan");
static_assert(sizeof(WritePlan) == kWritePlanBytes && alignof(WritePlan) == 8, "WritePlan");
static_assert(std::is_standard_layout_v<DecodePlan> && std::is_trivially_copyable_v<DecodePlan>);
static_assert(std::is_standard_layout_v<CompressPlan> && std::is_trivially_copyable_v<CompressPlan>);
static_assert(std::is_standard_layout_v<WritePlan> && std::is_trivially_copyable_v<WritePlan>);
static_assert(offsetof(DecodePlan, seq_len) == 0 && offsetof(DecodePlan, write_loc) == 4 &&
                  offsetof(DecodePlan, read_page_0) == 8 && offsetof(DecodePlan, read_page_1) == 12,
              "DecodePlan field offsets must match layouts.DECODE_PLAN");
static_assert(offsetof(CompressPlan, seq_len) == 0 && offsetof(CompressPlan, ragged_id) == 4 &&
                  offsetof(CompressPlan, buffer_len) == 6 && offsetof(CompressPlan, read_page_0) == 8 &&
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

}  // namespace flashcompress
