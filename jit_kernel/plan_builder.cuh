// flashcompress: GPU builders of the compressor plans (spec/compressor.md §3-§4).
//
// Device code only: includes the GPU runtime shim (gpu_runtime.h: CUDA or HIP, chosen by the
// compile command) and plan.cuh, never tvm-ffi. Every output byte equals what
// python/flashcompress/torch_backend/plans.py produces for the same inputs, in the same row
// order (batch-major, then position-ascending); no atomics anywhere. Warp-size agnostic (no
// warp intrinsics), so the same code is correct on 32-lane warps and 64-lane wavefronts.
//
// Tensors (all on one GPU, contiguous unless stated):
//   req_pool_indices  int64 [B]          request slot rid of batch entry b
//   seq_lens          int64 [B]          tokens including this step's
//   extend_lens       int64 [B]          prefill: tokens of this step (prefix = seq - extend)
//   req_to_token      int32 [R, L]       full KV loc of (rid, p) (paged C4 only)
//   full_to_state     int64 [F]          full loc -> SWA loc (paged C4)
//   DecodePlan        uint8 [B, 16]
//   CompressPlan      uint8 [rows, 16]   prefill compress list (and both online lists)
//   WritePlan         uint8 [rows, 8]    prefill write list
//   workspace         int64 [3 (B + 1)]  device prefill planners: per-request exclusive scans
//
// Kernels (one thread per output row unless stated):
//   decode_kernel<r>            DecodePlan of request b
//   online_decode_kernel<128>   online C128 DecodePlan of request b
//   prefill_stage1_kernel<r>    resolves CPU-built stage-0 rows in place, sentinels the rest
//   online_stage1_kernel<128>   same for the online lists
//   prefill_scan_kernel<r, on>  ONE block: per-request token / compress / write counts in
//                               closed form, exclusive scan over requests -> workspace
//   prefill_rows_kernel<r>      one thread per ragged token: the token's final compress and
//                               write rows at scan offset + rank within its request; rows past
//                               the totals become sentinels
//   online_prefill_rows_kernel<128> same for online segments
//
// Limits: prefill lists have at most 65536 rows (u16 ragged ids; checked by the binding). The
// scan kernel loops over tiles of 1024 requests, so any batch size works (the API layer bounds
// it by num_q_tokens). Device lengths are not validated (that would need a host sync): values
// outside 0 <= extend <= seq are clamped and plan-row writes are bounds-checked, so bad lengths
// give a meaningless plan but no out-of-bounds write. Paged table lookups (req_to_token,
// full_to_state) trust positions < L and rids < R, as upstream does.
//
// Every per-row computation is a __host__ __device__ function taking the row index, so that a
// host program can run exactly this code on the CPU (tests/native/plan_host_emulator.cu).
//
// The end of the file defines PlanLaunch<kRatio, kOnline> (declared in plan_launch.h), which a
// variant's kernel TU instantiates explicitly.
#pragma once

#include <cstdint>
#include <type_traits>

#include "gpu_runtime.h"
#include "launch.h"
#include "plan.cuh"
#include "plan_launch.h"

namespace flashcompress {
namespace plan {

inline constexpr int kRowBlock = 256;      // threads per block of the one-thread-per-row kernels
inline constexpr int kScanThreads = 1024;  // threads of the single-block scan kernel

// Whole warps on NVIDIA (32) and whole wavefronts on AMD (64); at most the 1024-thread block
// limit of both vendors. Nothing here depends on the lane count (see the scan kernel).
static_assert(kRowBlock % kMaxWarpSize == 0 && kRowBlock <= 1024,
              "plan: kRowBlock must be a multiple of 64 lanes and at most 1024");
static_assert(kScanThreads % kMaxWarpSize == 0 && kScanThreads <= 1024,
              "plan: kScanThreads must be a multiple of 64 lanes and at most 1024");

FC_HOST_DEVICE int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
FC_HOST_DEVICE int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }

// ------------------------------------------------------------------------------------------
// Addressing (§2.3)
// ------------------------------------------------------------------------------------------

FC_HOST_DEVICE int64_t state_row(const StateAddressing& a, int64_t rid, int64_t pos) {
  if (a.req_ring) {
    return rid * a.ring_size + pos % a.ring_size;
  }
  const int64_t full_loc = static_cast<int64_t>(a.req_to_token[rid * a.req_to_token_stride + pos]);
  const int64_t swa_loc = a.full_to_state[full_loc];
  return (swa_loc / a.swa_page_size) * a.ring_size + swa_loc % a.ring_size;
}

template <int kRatio>
FC_HOST_DEVICE int32_t state_page(const StateAddressing& a, int64_t rid, int64_t pos) {
  return static_cast<int32_t>(state_row(a, rid, pos) / kRatio);
}

// ------------------------------------------------------------------------------------------
// Decode (§4.1)
// ------------------------------------------------------------------------------------------

template <int kRatio>
FC_HOST_DEVICE void decode_row(const DecodeArgs& a, int64_t b) {
  const int64_t rid = a.req_pool_indices[b];
  const int64_t seq = a.seq_lens[b];
  const int64_t p1 = seq - 1;
  const int64_t p0 = max_i64(p1 - kRatio, 0);
  const int64_t write_loc = state_row(a.addr, rid, p1);
  DecodePlan row;
  row.seq_len = static_cast<uint32_t>(seq);
  row.write_loc = static_cast<int32_t>(write_loc);
  row.read_page_0 = state_page<kRatio>(a.addr, rid, p0);
  row.read_page_1 = static_cast<int32_t>(write_loc / kRatio);
  a.out[b] = row;
}

FC_HOST_DEVICE void online_decode_row(const OnlineDecodeArgs& a, int64_t b) {
  const int64_t slot = a.req_pool_indices[b] + a.addr.state_slot_offset;
  DecodePlan row;
  row.seq_len = static_cast<uint32_t>(a.seq_lens[b]);
  row.write_loc = static_cast<int32_t>(slot);
  row.read_page_0 = static_cast<int32_t>(slot);
  row.read_page_1 = -1;
  a.out[b] = row;
}

// ------------------------------------------------------------------------------------------
// Final compress / write rows from (batch b, rid, position p, ragged id) (§4.2 + §4.4)
// ------------------------------------------------------------------------------------------

// CompressPlan of the event at position p (p + 1 a multiple of r), j = p - prefix.
template <int kRatio>
FC_HOST_DEVICE CompressPlan final_compress_row(const StateAddressing& addr, int64_t b, int64_t rid,
                                               int64_t pos, int64_t j, int64_t ragged_id) {
  constexpr int64_t kWindow = window_size(kRatio);
  CompressPlan row;
  row.seq_len = static_cast<uint32_t>(pos + 1);
  row.ragged_id = static_cast<uint16_t>(ragged_id);
  const int64_t buffer_len = kWindow - min_i64(j + 1, kWindow);
  row.buffer_len = static_cast<uint16_t>(buffer_len);
  if (buffer_len > 0) {
    row.read_page_0 = state_page<kRatio>(addr, rid, max_i64(pos - kRatio, 0));
    row.read_page_1 = state_page<kRatio>(addr, rid, pos);
  } else {  // stage-1 leaves the stage-0 placeholders on rows that read no buffer
    row.read_page_0 = -1;
    row.read_page_1 = static_cast<int32_t>(b);
  }
  return row;
}

// Sentinel rows and the invalid-row test, per row type.
FC_HOST_DEVICE bool is_invalid(const CompressPlan& row) { return row.seq_len == kInvalidU32; }
FC_HOST_DEVICE bool is_invalid(const WritePlan& row) { return row.ragged_id == kInvalidU32; }

template <class Row>
FC_HOST_DEVICE Row invalid_row() {
  if constexpr (std::is_same_v<Row, WritePlan>) {
    return invalid_write_plan();
  } else {
    return invalid_compress_plan();
  }
}

// ------------------------------------------------------------------------------------------
// Prefill stage 1 over CPU-built stage-0 rows (§4.4)
// ------------------------------------------------------------------------------------------

// Row i of one list: padding rows (i >= num) and invalid stage-0 rows become sentinels; a valid
// row is handed to resolve(row), which fills in its state addresses and returns false when the
// row is to stay as it is.
template <class Row, class Resolve>
FC_HOST_DEVICE void stage1_list_row(Row* plan, int64_t rows, int64_t num, int64_t i, Resolve resolve) {
  if (i >= rows) return;
  if (i >= num) {
    plan[i] = invalid_row<Row>();
    return;
  }
  Row row = plan[i];
  if (is_invalid(row)) {
    plan[i] = invalid_row<Row>();
  } else if (resolve(row)) {
    plan[i] = row;
  }
}

template <int kRatio>
FC_HOST_DEVICE void prefill_stage1_row(const PrefillStage1Args& a, int64_t i) {
  stage1_list_row(a.plan_c, a.rows_c, a.num_c, i, [&](CompressPlan& row) {
    const int64_t b = row.read_page_1;  // stage 0 stores the batch index here
    // valid rows with buffer_len == 0 keep (-1, b)
    if (row.buffer_len == 0 || b < 0 || b >= a.batch) return false;
    const int64_t rid = a.req_pool_indices[b];
    const int64_t p1 = static_cast<int64_t>(row.seq_len) - 1;
    row.read_page_0 = state_page<kRatio>(a.addr, rid, max_i64(p1 - kRatio, 0));
    row.read_page_1 = state_page<kRatio>(a.addr, rid, p1);
    return true;
  });
  stage1_list_row(a.plan_w, a.rows_w, a.num_w, i, [&](WritePlan& row) {
    const int64_t b = static_cast<int64_t>(row.ragged_id >> 16);
    if (b >= a.batch) return false;
    const int64_t rid = a.req_pool_indices[b];
    const int64_t pos = static_cast<int64_t>(row.write_loc) - 1;
    row.ragged_id &= 0xFFFFu;
    row.write_loc = static_cast<int32_t>(state_row(a.addr, rid, pos));
    return true;
  });
}

FC_HOST_DEVICE void online_stage1_row(const OnlinePrefillStage1Args& a, int64_t i) {
  // Both lists: stage 0 stores the batch index in read_page_0.
  const auto resolve = [&](CompressPlan& row) {
    const int64_t b = row.read_page_0;
    if (b < 0 || b >= a.batch) return false;
    const int64_t rid = a.req_pool_indices[b];
    row.read_page_0 = static_cast<int32_t>(rid + a.addr.state_slot_offset);
    row.read_page_1 = static_cast<int32_t>(rid);
    return true;
  };
  stage1_list_row(a.plan_c, a.rows_c, a.num_c, i, resolve);
  stage1_list_row(a.plan_w, a.rows_w, a.num_w, i, resolve);
}

// ------------------------------------------------------------------------------------------
// Device stage 0 + 1 (the CUDA-graph path, §4.3 made deterministic)
// ------------------------------------------------------------------------------------------

// One request of the batch. Inputs outside 0 <= extend <= seq are clamped so that every
// memory access stays in bounds (the plan is then meaningless, as it is upstream); the API
// layer cannot check device values without a host synchronisation.
struct Request {
  int64_t seq;
  int64_t extend;
  int64_t prefix;
};

FC_HOST_DEVICE Request load_request(const int64_t* seq_lens, const int64_t* extend_lens,
                                    int64_t b) {
  Request q;
  q.seq = max_i64(seq_lens[b], 0);
  q.extend = min_i64(max_i64(extend_lens[b], 0), q.seq);
  q.prefix = q.seq - q.extend;
  return q;
}

// Which positions of a request's extend a prefill persists (§2.4):
// p >= first_w, or (paged C4 only) p % swa_page_size >= swa_page_size - 4.
struct WritePolicy {
  int64_t first_w;
  int64_t tail_page;  // swa_page_size when the page-tail rule applies, else 0

  FC_HOST_DEVICE bool written(int64_t pos) const {
    return pos >= first_w || (tail_page > 0 && pos % tail_page >= tail_page - 4);
  }
  // Number of q in [0, x) with q % tail_page >= tail_page - 4 (x >= 0, tail_page > 0).
  FC_HOST_DEVICE int64_t tail_below(int64_t x) const {
    const int64_t t = tail_page - 4;
    if (t <= 0) return x;
    return (x / tail_page) * 4 + max_i64(x % tail_page - t, 0);
  }
  // Number of written positions in [lo, hi) (0 <= lo <= hi).
  FC_HOST_DEVICE int64_t count(int64_t lo, int64_t hi) const {
    const int64_t below = max_i64(min_i64(hi, first_w), lo);  // [lo, below) lies under first_w
    int64_t n = hi - below;
    if (tail_page > 0) n += tail_below(below) - tail_below(lo);
    return n;
  }
};

template <int kRatio>
FC_HOST_DEVICE WritePolicy make_write_policy(const StateAddressing& addr, int64_t seq) {
  const int64_t last_c = (seq / kRatio) * kRatio;
  WritePolicy w;
  w.first_w = min_i64(last_c - (kRatio == 4 ? 4 : 0), seq - mtp_write_pad(kRatio, addr.ring_size));
  w.tail_page = (kRatio == 4 && !addr.req_ring && addr.swa_page_size > 0) ? addr.swa_page_size : 0;
  return w;
}

struct RequestCounts {
  int64_t tokens;
  int64_t compress_rows;
  int64_t write_rows;
};

// Rows request b contributes to each list, in closed form. Compress rows: the events p in
// [prefix, seq) with (p + 1) % r == 0. Write rows: the written positions; online C128 cuts the
// extend at multiples of 128, and the trailing partial segment (if any) is its one write row.
template <int kRatio, bool kOnline>
FC_HOST_DEVICE RequestCounts request_counts(const DeviceArgsOf<kOnline>& a, int64_t b) {
  const Request q = load_request(a.seq_lens, a.extend_lens, b);
  RequestCounts n;
  n.tokens = q.extend;
  n.compress_rows = q.seq / kRatio - q.prefix / kRatio;
  if constexpr (kOnline) {
    n.write_rows = (q.extend > 0 && q.seq % kRatio != 0) ? 1 : 0;
  } else {
    n.write_rows = make_write_policy<kRatio>(a.addr, q.seq).count(q.prefix, q.seq);
  }
  return n;
}

// Workspace views: tok[b], comp[b], wr[b] = exclusive prefix sums, index batch = total.
struct ScanView {
  const int64_t* tok;
  const int64_t* comp;
  const int64_t* wr;
};

FC_HOST_DEVICE ScanView scan_view(const int64_t* workspace, int64_t batch) {
  ScanView v;
  v.tok = workspace;
  v.comp = workspace + (batch + 1);
  v.wr = workspace + 2 * (batch + 1);
  return v;
}

// The request owning ragged token i: tok[b] <= i < tok[b + 1]. Needs batch >= 1, i < tok[batch].
FC_HOST_DEVICE int64_t find_request(const int64_t* tok, int64_t batch, int64_t i) {
  int64_t lo = 0, hi = batch;  // invariant: tok[lo] <= i < tok[hi]
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (tok[mid] <= i) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Thread i of the rows kernel: emit(s, b, q, pos) writes the rows of ragged token i (if any:
// request b, position pos), then rows i of either list past its total become sentinels. Rows
// written for tokens have index < total <= i, so the two kinds of writes never touch the same
// row.
template <bool kOnline, class Emit>
FC_HOST_DEVICE void device_rows(const DeviceArgsOf<kOnline>& a, int64_t i, Emit emit) {
  const ScanView s = scan_view(a.workspace, a.batch);
  const int64_t total_tok = s.tok[a.batch];
  const int64_t total_c = s.comp[a.batch];
  const int64_t total_w = s.wr[a.batch];
  if (i < total_tok) {
    const int64_t b = find_request(s.tok, a.batch, i);
    const Request q = load_request(a.seq_lens, a.extend_lens, b);
    emit(s, b, q, q.prefix + (i - s.tok[b]));
  }
  if (i >= total_c) a.plan_c[i] = invalid_compress_plan();
  if (i >= total_w) a.plan_w[i] = invalid_row<WriteRowOf<kOnline>>();
}

// Index in the compress list of the event at position pos of request b.
template <int kRatio>
FC_HOST_DEVICE int64_t compress_index(const ScanView& s, int64_t b, const Request& q, int64_t pos) {
  return s.comp[b] + pos / kRatio - q.prefix / kRatio;
}

template <int kRatio>
FC_HOST_DEVICE void prefill_device_row(const PrefillDeviceArgs& a, int64_t i) {
  device_rows<false>(a, i, [&](const ScanView& s, int64_t b, const Request& q, int64_t pos) {
    const int64_t rid = a.req_pool_indices[b];
    if ((pos + 1) % kRatio == 0) {
      const int64_t idx = compress_index<kRatio>(s, b, q, pos);
      if (idx >= 0 && idx < a.num_rows) {
        a.plan_c[idx] = final_compress_row<kRatio>(a.addr, b, rid, pos, pos - q.prefix, i);
      }
    }
    const WritePolicy policy = make_write_policy<kRatio>(a.addr, q.seq);
    if (policy.written(pos)) {
      const int64_t idx = s.wr[b] + policy.count(q.prefix, pos);
      if (idx >= 0 && idx < a.num_rows) {
        WritePlan row;
        row.ragged_id = static_cast<uint32_t>(i);
        row.write_loc = static_cast<int32_t>(state_row(a.addr, rid, pos));
        a.plan_w[idx] = row;
      }
    }
  });
}

// Online C128: a token that closes a 128-chunk is a compress row, the request's last token (if
// it does not) the write row; both carry the segment since max(prefix, chunk start).
template <int kRatio>
FC_HOST_DEVICE void online_prefill_device_row(const OnlinePrefillDeviceArgs& a, int64_t i) {
  device_rows<true>(a, i, [&](const ScanView& s, int64_t b, const Request& q, int64_t pos) {
    const bool closes_chunk = (pos + 1) % kRatio == 0;
    const bool last_partial = !closes_chunk && pos + 1 == q.seq;
    if (!closes_chunk && !last_partial) return;
    const int64_t rid = a.req_pool_indices[b];
    const int64_t seg_start = max_i64(q.prefix, (pos / kRatio) * kRatio);
    CompressPlan row;
    row.seq_len = static_cast<uint32_t>(pos + 1);
    row.ragged_id = static_cast<uint16_t>(i);
    row.buffer_len = static_cast<uint16_t>(pos + 1 - seg_start);
    row.read_page_0 = static_cast<int32_t>(rid + a.addr.state_slot_offset);
    row.read_page_1 = static_cast<int32_t>(rid);
    const int64_t idx = closes_chunk ? compress_index<kRatio>(s, b, q, pos) : s.wr[b];
    CompressPlan* list = closes_chunk ? a.plan_c : a.plan_w;
    if (idx >= 0 && idx < a.num_rows) list[idx] = row;
  });
}

// ------------------------------------------------------------------------------------------
// Kernels
// ------------------------------------------------------------------------------------------

__device__ __forceinline__ int64_t global_thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

template <int kRatio>
__global__ void __launch_bounds__(kRowBlock) decode_kernel(const DecodeArgs a) {
  const int64_t b = global_thread_index();
  if (b < a.batch) decode_row<kRatio>(a, b);
}

// Online kernels are templates only so that they are instantiated by online variants alone.
template <int kRatio>
__global__ void __launch_bounds__(kRowBlock) online_decode_kernel(const OnlineDecodeArgs a) {
  static_assert(kRatio == 128, "online compression exists only for ratio 128");
  const int64_t b = global_thread_index();
  if (b < a.batch) online_decode_row(a, b);
}

template <int kRatio>
__global__ void __launch_bounds__(kRowBlock) prefill_stage1_kernel(const PrefillStage1Args a) {
  prefill_stage1_row<kRatio>(a, global_thread_index());  // bounds checked per list
}

template <int kRatio>
__global__ void __launch_bounds__(kRowBlock) online_stage1_kernel(const OnlinePrefillStage1Args a) {
  static_assert(kRatio == 128, "online compression exists only for ratio 128");
  online_stage1_row(a, global_thread_index());  // bounds checked per list
}

// Single block of kScanThreads threads. Requests are processed in tiles of kScanThreads; each
// tile is scanned in shared memory (Hillis-Steele, no warp intrinsics so the code is
// warp-size agnostic) and offset by the running total of the previous tiles. Every step is
// separated by block-wide __syncthreads(), never by warp-synchronous assumptions, so it is
// correct for 32-lane warps and 64-lane wavefronts alike. Shared memory: 3 * 8 KiB.
template <int kRatio, bool kOnline, typename Args>
__global__ void __launch_bounds__(kScanThreads) prefill_scan_kernel(const Args a) {
  __shared__ int64_t s_tok[kScanThreads];
  __shared__ int64_t s_comp[kScanThreads];
  __shared__ int64_t s_wr[kScanThreads];
  const int tid = static_cast<int>(threadIdx.x);
  int64_t* out_tok = a.workspace;
  int64_t* out_comp = a.workspace + (a.batch + 1);
  int64_t* out_wr = a.workspace + 2 * (a.batch + 1);
  int64_t carry_tok = 0, carry_comp = 0, carry_wr = 0;

  for (int64_t base = 0; base < a.batch; base += kScanThreads) {  // uniform across the block
    const int64_t b = base + tid;
    RequestCounts own = {0, 0, 0};
    if (b < a.batch) own = request_counts<kRatio, kOnline>(a, b);
    s_tok[tid] = own.tokens;
    s_comp[tid] = own.compress_rows;
    s_wr[tid] = own.write_rows;
    __syncthreads();
    for (int offset = 1; offset < kScanThreads; offset <<= 1) {
      int64_t add_tok = 0, add_comp = 0, add_wr = 0;
      if (tid >= offset) {
        add_tok = s_tok[tid - offset];
        add_comp = s_comp[tid - offset];
        add_wr = s_wr[tid - offset];
      }
      __syncthreads();  // all reads of this step happen before any write
      s_tok[tid] += add_tok;
      s_comp[tid] += add_comp;
      s_wr[tid] += add_wr;
      __syncthreads();
    }
    // s_*[tid] is now the inclusive sum of the tile up to tid.
    if (b < a.batch) {
      out_tok[b] = carry_tok + s_tok[tid] - own.tokens;
      out_comp[b] = carry_comp + s_comp[tid] - own.compress_rows;
      out_wr[b] = carry_wr + s_wr[tid] - own.write_rows;
    }
    carry_tok += s_tok[kScanThreads - 1];
    carry_comp += s_comp[kScanThreads - 1];
    carry_wr += s_wr[kScanThreads - 1];
    __syncthreads();  // every thread has read the tile totals before the next tile overwrites
  }
  if (tid == 0) {
    out_tok[a.batch] = carry_tok;
    out_comp[a.batch] = carry_comp;
    out_wr[a.batch] = carry_wr;
  }
}

template <int kRatio>
__global__ void __launch_bounds__(kRowBlock) prefill_rows_kernel(const PrefillDeviceArgs a) {
  const int64_t i = global_thread_index();
  if (i < a.num_rows) prefill_device_row<kRatio>(a, i);
}

template <int kRatio>
__global__ void __launch_bounds__(kRowBlock)
    online_prefill_rows_kernel(const OnlinePrefillDeviceArgs a) {
  static_assert(kRatio == 128, "online compression exists only for ratio 128");
  const int64_t i = global_thread_index();
  if (i < a.num_rows) online_prefill_device_row<kRatio>(a, i);
}

// ------------------------------------------------------------------------------------------
// Launchers: plain host functions on the caller's stream. Empty work launches nothing (a
// zero-size grid is a launch error). They return the launch status; no synchronisation.
// ------------------------------------------------------------------------------------------

inline unsigned int row_blocks(int64_t rows) {
  return static_cast<unsigned int>((rows + kRowBlock - 1) / kRowBlock);
}

template <int kRatio>
gpuError_t launch_decode(const DecodeArgs& a, gpuStream_t stream) {
  if (a.batch <= 0) return gpuSuccess;
  return launch_kernel(decode_kernel<kRatio>, {row_blocks(a.batch), kRowBlock}, stream, a);
}

template <int kRatio>
gpuError_t launch_online_decode(const OnlineDecodeArgs& a, gpuStream_t stream) {
  if (a.batch <= 0) return gpuSuccess;
  return launch_kernel(online_decode_kernel<kRatio>, {row_blocks(a.batch), kRowBlock}, stream, a);
}

template <int kRatio>
gpuError_t launch_prefill_stage1(const PrefillStage1Args& a, gpuStream_t stream) {
  const int64_t rows = max_i64(a.rows_c, a.rows_w);
  if (rows <= 0) return gpuSuccess;
  return launch_kernel(prefill_stage1_kernel<kRatio>, {row_blocks(rows), kRowBlock}, stream, a);
}

template <int kRatio>
gpuError_t launch_online_prefill_stage1(const OnlinePrefillStage1Args& a, gpuStream_t stream) {
  const int64_t rows = max_i64(a.rows_c, a.rows_w);
  if (rows <= 0) return gpuSuccess;
  return launch_kernel(online_stage1_kernel<kRatio>, {row_blocks(rows), kRowBlock}, stream, a);
}

template <int kRatio>
gpuError_t launch_prefill_device(const PrefillDeviceArgs& a, gpuStream_t stream) {
  if (a.num_rows <= 0) return gpuSuccess;
  gpuError_t err = launch_kernel(prefill_scan_kernel<kRatio, false, PrefillDeviceArgs>, {1, kScanThreads}, stream, a);
  if (err != gpuSuccess) return err;
  return launch_kernel(prefill_rows_kernel<kRatio>, {row_blocks(a.num_rows), kRowBlock}, stream, a);
}

template <int kRatio>
gpuError_t launch_online_prefill_device(const OnlinePrefillDeviceArgs& a, gpuStream_t stream) {
  if (a.num_rows <= 0) return gpuSuccess;
  gpuError_t err = launch_kernel(prefill_scan_kernel<kRatio, true, OnlinePrefillDeviceArgs>, {1, kScanThreads}, stream, a);
  if (err != gpuSuccess) return err;
  return launch_kernel(online_prefill_rows_kernel<kRatio>, {row_blocks(a.num_rows), kRowBlock}, stream, a);
}

}  // namespace plan

// PlanLaunch (plan_launch.h): a variant's kernel TU instantiates it for its (ratio, online).
template <int kRatio, bool kOnline>
gpuError_t PlanLaunch<kRatio, kOnline>::decode(const typename Args::Decode& a, gpuStream_t s) {
  if constexpr (kOnline) return plan::launch_online_decode<kRatio>(a, s);
  else return plan::launch_decode<kRatio>(a, s);
}

template <int kRatio, bool kOnline>
gpuError_t PlanLaunch<kRatio, kOnline>::prefill_stage1(const typename Args::Stage1& a,
                                                       gpuStream_t s) {
  if constexpr (kOnline) return plan::launch_online_prefill_stage1<kRatio>(a, s);
  else return plan::launch_prefill_stage1<kRatio>(a, s);
}

template <int kRatio, bool kOnline>
gpuError_t PlanLaunch<kRatio, kOnline>::prefill_device(const typename Args::Device& a,
                                                       gpuStream_t s) {
  if constexpr (kOnline) return plan::launch_online_prefill_device<kRatio>(a, s);
  else return plan::launch_prefill_device<kRatio>(a, s);
}

}  // namespace flashcompress
