// flashcompress: tvm-ffi binding of the `plan` JIT family (host code, compiled by the host
// compiler; included only by the binding TU rendered from templates/plan_binding.cpp.j2, never
// by a .cu file: the tvm-ffi headers are slow under nvcc).
//
// PlanBinding<kRatio, kOnline> holds the four exports of one variant as static member
// functions; they check their arguments and call PlanLaunch<kRatio, kOnline> (plan_launch.h),
// which the kernel TU instantiates. The regular and online halves share their checks
// (decode_common, stage1_common, device_common below) and differ only in the state
// addressing (tables vs. state_slot_offset). The device type (kDLCUDA / kDLROCM) follows the
// GPU runtime of the compile command (gpu_runtime.h).
//
// Every export checks every tensor argument (ffi_check.h: TypeError for a wrong dtype,
// ValueError for everything else, the message naming the argument) before anything runs,
// never reads device memory, takes the caller's stream (TVMFFIEnvGetStream) and launches on the
// device of its first output. Outputs are pre-allocated by the caller. All tensors are
// contiguous and live on that one device unless noted. Python: cuda_ops/plans.py.
//
// Exports of the regular variants (kOnline = false; ratio 4 or 128):
//   decode(out u8[B,16], req_pool_indices i64[B], req_to_token i32[R,L], full_to_state i64[F],
//          seq_lens i64[B], swa_page_size, ring_size, use_req_ring)
//   prefill_stage1(plan_c u8[Nc,16], plan_w u8[Nw,8], num_c, num_w, req_pool_indices i64[B],
//                  req_to_token i32[R,L], full_to_state i64[F], swa_page_size, ring_size,
//                  use_req_ring)
//   prefill_device(plan_c u8[N,16], plan_w u8[N,8], workspace i64[3(B+1)],
//                  req_pool_indices i64[B], seq_lens i64[B], extend_lens i64[B],
//                  req_to_token i32[R,L], full_to_state i64[F], swa_page_size, ring_size,
//                  use_req_ring)
// Exports of the online variant (kOnline = true; ratio 128):
//   decode(out u8[B,16], req_pool_indices i64[B], seq_lens i64[B], state_slot_offset)
//   prefill_stage1(plan_c u8[Nc,16], plan_w u8[Nw,16], num_c, num_w, req_pool_indices i64[B],
//                  state_slot_offset)
//   prefill_device(plan_c u8[N,16], plan_w u8[N,16], workspace i64[3(B+1)],
//                  req_pool_indices i64[B], seq_lens i64[B], extend_lens i64[B],
//                  state_slot_offset)
// decode_checked: decode plus the API's checks the plain export leaves out (the eager path of
// CompressorDecodePlan.generate / generate_online, flashcompress.fastpath):
//   regular: decode_checked(same arguments as decode)   the tables contiguous in every mode
//   online:  decode_checked(out, req_pool_indices, req_to_token i32[R,L], seq_lens,
//                           state_slot_offset)           req_to_token checked, offset <= INT32_MAX - R
// decode_alloc(decode_checked's arguments without out) -> out: the rows allocated here through the
//   caller's allocator (TVMFFIEnvTensorAlloc; torch's for torch tensors), then decode_checked
// prefill_host: the eager prefill plan of host lengths (plan_host_prefill.h), one call:
//   regular: prefill_host(seq_lens i64[B] host, extend_lens i64[B] host, req_pool_indices i64[B],
//                         req_to_token i32[R,L], full_to_state i64[F], swa_page_size, ring_size,
//                         use_req_ring, num_q_tokens, pad) -> [plan_c u8[C,16], plan_w u8[W,8]]
//   online:  prefill_host(seq_lens, extend_lens, req_pool_indices, req_to_token i32[R,L],
//                         num_q_tokens, pad, state_slot_offset) -> [plan_c u8[C,16], plan_w u8[W,16]]
//   exact counts C, W (pad: num_q_tokens rows each, sentinels past the counts); B >= 1.
// Both:
//   layout_info() -> str, JSON of the C++ plan layouts (host only; no GPU needed)
//
// Argument details:
//   plan rows (out, plan_c, plan_w): uint8 [rows, row bytes], aligned to the row size.
//   num_c in [0, Nc], num_w in [0, Nw]: rows before them are stage-0 rows, later rows padding.
//   req_pool_indices of prefill_stage1 may have any length B (1-D int64).
//   prefill_device: N (= num_q_tokens) and B in [0, 65536].
//   Scalars are int64 (use_req_ring: bool); ring_size in [1, INT32_MAX], state_slot_offset in
//   [0, INT32_MAX].
//   req_to_token / full_to_state: only dtype, rank and device are checked when the request
//   ring is used (use_req_ring, or ratio 128, which always uses it; the tables may then be
//   empty); paged addressing also needs them contiguous and swa_page_size in [1, INT32_MAX].
//   Empty outputs (B = 0, Nc = Nw = 0, N = 0) return after the checks without a launch.
#pragma once

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/string.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>

#include "ffi_check.h"  // also the GPU error check and device guard (gpu_runtime.h)
#include "gpu_runtime.h"
#include "layout.h"
#include "plan.cuh"
#include "plan_host_prefill.h"
#include "plan_launch.h"

namespace flashcompress {
namespace plan_binding {

namespace chk = ::flashcompress::ffi_check;
using tvm::ffi::TensorView;

inline constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// The device of the first output; every other tensor must live there.
inline DLDevice output_device(const TensorView& t, const char* name, DLDeviceType device_type) {
  chk::check_device_type(t, name, device_type);
  return t.device();
}

// uint8 [rows, row_bytes], contiguous, row-aligned; returns rows.
inline int64_t check_plan_rows(const TensorView& t, const char* name, int64_t row_bytes,
                               DLDevice dev) {
  chk::check_tensor(t, name, chk::kUInt8, {chk::kAnySize, row_bytes}, dev);
  chk::check_aligned(t, name, static_cast<uint64_t>(row_bytes));
  return t.size(0);
}

inline void check_index_vector(const TensorView& t, const char* name, int64_t n, DLDevice dev) {
  chk::check_tensor(t, name, chk::kInt64, {n}, dev);
}

// The DecodePlan rows of decode_alloc: uint8 [B, 16] on the device of req_pool_indices (a GPU
// tensor, int64 [B]), from the caller's allocator (TVMFFIEnvTensorAlloc: torch's, set by tvm-ffi
// for a call with torch tensors; it allocates on the device's current stream, as torch.empty does).
inline tvm::ffi::Tensor alloc_decode_rows(const TensorView& req_pool_indices) {
  chk::check_device_type(req_pool_indices, "req_pool_indices", chk::kGpuDeviceType);
  chk::check_dtype(req_pool_indices, "req_pool_indices", chk::kInt64);
  chk::check_ndim(req_pool_indices, "req_pool_indices", 1);
  const int64_t shape[2] = {req_pool_indices.size(0), kDecodePlanBytes};
  return tvm::ffi::Tensor::FromEnvAlloc(TVMFFIEnvTensorAlloc, tvm::ffi::ShapeView(shape, 2), chk::kUInt8,
                                        req_pool_indices.device());
}

// Checks the addressing tables and scalars of the regular variants; see StateAddressing.
template <int kRatio>
StateAddressing make_addressing(const TensorView& req_to_token, const TensorView& full_to_state,
                                int64_t swa_page_size, int64_t ring_size, bool use_req_ring,
                                DLDevice dev) {
  chk::check_dtype(req_to_token, "req_to_token", chk::kInt32);
  chk::check_ndim(req_to_token, "req_to_token", 2);
  chk::check_same_device(req_to_token, "req_to_token", dev);
  chk::check_dtype(full_to_state, "full_to_state", chk::kInt64);
  chk::check_ndim(full_to_state, "full_to_state", 1);
  chk::check_same_device(full_to_state, "full_to_state", dev);
  chk::check_range(ring_size, "ring_size", 1, kInt32Max);
  StateAddressing addr{};
  addr.req_ring = kRatio != 4 || use_req_ring;  // ratio 128 always uses the request ring
  addr.ring_size = ring_size;
  addr.swa_page_size = swa_page_size;
  addr.req_to_token = static_cast<const int32_t*>(req_to_token.data_ptr());
  addr.full_to_state = static_cast<const int64_t*>(full_to_state.data_ptr());
  addr.req_to_token_stride = 0;
  if (!addr.req_ring) {
    chk::check_range(swa_page_size, "swa_page_size", 1, kInt32Max);
    chk::check_contiguous(req_to_token, "req_to_token");
    chk::check_contiguous(full_to_state, "full_to_state");
    addr.req_to_token_stride = req_to_token.size(1);
  }
  return addr;
}

template <typename T>
std::string hex_bytes(const T& value) {
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

struct FieldInfo {
  const char* name;
  size_t offset, size;
};

// "Name": {"size": .., "align": .., "fields": {"field": [offset, size], ...}}
template <typename Row, size_t N>
void row_json(std::ostream& os, const char* name, const FieldInfo (&fields)[N]) {
  os << ", \"" << name << "\": {\"size\": " << sizeof(Row) << ", \"align\": " << alignof(Row) << ", \"fields\": {";
  for (size_t i = 0; i < N; ++i) {
    os << (i ? ", " : "") << "\"" << fields[i].name << "\": [" << fields[i].offset << ", " << fields[i].size << "]";
  }
  os << "}}";
}

// The C++ side of layouts.py, for tests that compare the two (no GPU involved).
template <int kRatio, bool kOnline>
tvm::ffi::String layout_json() {
  std::ostringstream os;
  os << "{\"ratio\": " << kRatio << ", \"online\": " << (kOnline ? "true" : "false")
     << ", \"window\": " << window_size(kRatio) << ", \"max_ragged_id\": " << kMaxRaggedId;
  row_json<DecodePlan>(os, "DecodePlan",
                       {{"seq_len", offsetof(DecodePlan, seq_len), sizeof(DecodePlan::seq_len)},
                        {"write_loc", offsetof(DecodePlan, write_loc), sizeof(DecodePlan::write_loc)},
                        {"read_page_0", offsetof(DecodePlan, read_page_0), sizeof(DecodePlan::read_page_0)},
                        {"read_page_1", offsetof(DecodePlan, read_page_1), sizeof(DecodePlan::read_page_1)}});
  row_json<CompressPlan>(os, "CompressPlan",
                         {{"seq_len", offsetof(CompressPlan, seq_len), sizeof(CompressPlan::seq_len)},
                          {"ragged_id", offsetof(CompressPlan, ragged_id), sizeof(CompressPlan::ragged_id)},
                          {"buffer_len", offsetof(CompressPlan, buffer_len), sizeof(CompressPlan::buffer_len)},
                          {"read_page_0", offsetof(CompressPlan, read_page_0), sizeof(CompressPlan::read_page_0)},
                          {"read_page_1", offsetof(CompressPlan, read_page_1), sizeof(CompressPlan::read_page_1)}});
  row_json<WritePlan>(os, "WritePlan",
                      {{"ragged_id", offsetof(WritePlan, ragged_id), sizeof(WritePlan::ragged_id)},
                       {"write_loc", offsetof(WritePlan, write_loc), sizeof(WritePlan::write_loc)}});
  os << ", \"invalid_compress_row\": \"" << hex_bytes(invalid_compress_plan()) << "\""
     << ", \"invalid_write_row\": \"" << hex_bytes(invalid_write_plan()) << "\"}";
  return tvm::ffi::String(os.str());
}

// ------------------------------------------------------------------------------------------
// Checks shared by the regular and the online variants
// ------------------------------------------------------------------------------------------

struct Rows {
  DLDevice dev;
  int64_t rows;   // decode: batch; stage 1: rows of plan_c; device planner: num_q_tokens
  int64_t rows_w;  // stage 1: rows of plan_w
  int64_t batch;
};

// decode(out u8[B,16], req_pool_indices i64[B], seq_lens i64[B], ...)
inline Rows decode_common(const TensorView& out, const TensorView& req_pool_indices,
                          const TensorView& seq_lens) {
  const DLDevice dev = output_device(out, "out", chk::kGpuDeviceType);
  const int64_t batch = check_plan_rows(out, "out", kDecodePlanBytes, dev);
  check_index_vector(req_pool_indices, "req_pool_indices", batch, dev);
  check_index_vector(seq_lens, "seq_lens", batch, dev);
  return {dev, batch, 0, batch};
}

// prefill_stage1(plan_c u8[Nc,16], plan_w u8[Nw,w_bytes], num_c, num_w, req_pool_indices i64[B], ...)
inline Rows stage1_common(const TensorView& plan_c, const TensorView& plan_w, int64_t num_c,
                          int64_t num_w, const TensorView& req_pool_indices, int64_t w_bytes) {
  const DLDevice dev = output_device(plan_c, "plan_c", chk::kGpuDeviceType);
  const int64_t rows_c = check_plan_rows(plan_c, "plan_c", kCompressPlanBytes, dev);
  const int64_t rows_w = check_plan_rows(plan_w, "plan_w", w_bytes, dev);
  chk::check_range(num_c, "num_c", 0, rows_c);
  chk::check_range(num_w, "num_w", 0, rows_w);
  chk::check_dtype(req_pool_indices, "req_pool_indices", chk::kInt64);
  chk::check_ndim(req_pool_indices, "req_pool_indices", 1);
  chk::check_contiguous(req_pool_indices, "req_pool_indices");
  chk::check_same_device(req_pool_indices, "req_pool_indices", dev);
  return {dev, rows_c, rows_w, req_pool_indices.size(0)};
}

// prefill_device(plan_c u8[N,16], plan_w u8[N,w_bytes], workspace i64[3(B+1)],
//                req_pool_indices i64[B], seq_lens i64[B], extend_lens i64[B], ...)
inline Rows device_common(const TensorView& plan_c, const TensorView& plan_w,
                          const TensorView& workspace, const TensorView& req_pool_indices,
                          const TensorView& seq_lens, const TensorView& extend_lens,
                          int64_t w_bytes) {
  const DLDevice dev = output_device(plan_c, "plan_c", chk::kGpuDeviceType);
  const int64_t rows = check_plan_rows(plan_c, "plan_c", kCompressPlanBytes, dev);
  chk::check_range(rows, "num_q_tokens (plan_c.shape[0])", 0, kMaxRaggedId);
  chk::check_tensor(plan_w, "plan_w", chk::kUInt8, {rows, w_bytes}, dev);
  chk::check_aligned(plan_w, "plan_w", static_cast<uint64_t>(w_bytes));
  chk::check_dtype(req_pool_indices, "req_pool_indices", chk::kInt64);
  chk::check_ndim(req_pool_indices, "req_pool_indices", 1);
  const int64_t batch = req_pool_indices.size(0);
  chk::check_range(batch, "batch size", 0, kMaxRaggedId);
  check_index_vector(req_pool_indices, "req_pool_indices", batch, dev);
  check_index_vector(seq_lens, "seq_lens", batch, dev);
  check_index_vector(extend_lens, "extend_lens", batch, dev);
  chk::check_tensor(workspace, "workspace", chk::kInt64, {prefill_workspace_size(batch)}, dev);
  return {dev, rows, rows, batch};
}

// Fill the fields every decode / stage-1 / device-planner argument struct has.
template <typename Args>
void fill_decode(Args& a, const Rows& r, const TensorView& out, const TensorView& rids,
                 const TensorView& seq_lens) {
  a.out = static_cast<DecodePlan*>(out.data_ptr());
  a.req_pool_indices = static_cast<const int64_t*>(rids.data_ptr());
  a.seq_lens = static_cast<const int64_t*>(seq_lens.data_ptr());
  a.batch = r.batch;
}

template <typename Args>
void fill_stage1(Args& a, const Rows& r, const TensorView& plan_c, const TensorView& plan_w,
                 int64_t num_c, int64_t num_w, const TensorView& rids) {
  a.plan_c = static_cast<CompressPlan*>(plan_c.data_ptr());
  a.plan_w = static_cast<std::remove_pointer_t<decltype(a.plan_w)>*>(plan_w.data_ptr());
  a.rows_c = r.rows;
  a.num_c = num_c;
  a.rows_w = r.rows_w;
  a.num_w = num_w;
  a.req_pool_indices = static_cast<const int64_t*>(rids.data_ptr());
  a.batch = r.batch;
}

template <typename Args>
void fill_device(Args& a, const Rows& r, const TensorView& plan_c, const TensorView& plan_w,
                 const TensorView& workspace, const TensorView& rids, const TensorView& seq_lens,
                 const TensorView& extend_lens) {
  a.plan_c = static_cast<CompressPlan*>(plan_c.data_ptr());
  a.plan_w = static_cast<std::remove_pointer_t<decltype(a.plan_w)>*>(plan_w.data_ptr());
  a.num_rows = r.rows;
  a.workspace = static_cast<int64_t*>(workspace.data_ptr());
  a.req_pool_indices = static_cast<const int64_t*>(rids.data_ptr());
  a.seq_lens = static_cast<const int64_t*>(seq_lens.data_ptr());
  a.extend_lens = static_cast<const int64_t*>(extend_lens.data_ptr());
  a.batch = r.batch;
}

// The exports of one variant; defined for kOnline = false and kOnline = true below.
template <int kRatio, bool kOnline>
struct PlanBinding;

// Regular variants (ratio 4 or 128; paged or request-ring state addressing).
template <int kRatio>
struct PlanBinding<kRatio, false> {
  using Launch = PlanLaunch<kRatio, false>;

  static void decode(TensorView out, TensorView req_pool_indices, TensorView req_to_token,
                     TensorView full_to_state, TensorView seq_lens, int64_t swa_page_size,
                     int64_t ring_size, bool use_req_ring) {
    const Rows r = decode_common(out, req_pool_indices, seq_lens);
    DecodeArgs args{};
    args.addr = make_addressing<kRatio>(req_to_token, full_to_state, swa_page_size, ring_size,
                                        use_req_ring, r.dev);
    if (r.batch == 0) return;
    fill_decode(args, r, out, req_pool_indices, seq_lens);
    chk::launch_on(r.dev, &Launch::decode, args);
  }

  // decode with the API's table checks in every addressing mode (contiguous tables): the eager
  // path of CompressorDecodePlan.generate (flashcompress.fastpath) calls it with the caller's tensors.
  static void decode_checked(TensorView out, TensorView req_pool_indices, TensorView req_to_token,
                             TensorView full_to_state, TensorView seq_lens, int64_t swa_page_size,
                             int64_t ring_size, bool use_req_ring) {
    chk::check_contiguous(req_to_token, "req_to_token");
    chk::check_contiguous(full_to_state, "full_to_state");
    decode(out, req_pool_indices, req_to_token, full_to_state, seq_lens, swa_page_size, ring_size, use_req_ring);
  }

  // decode_checked into rows it allocates (alloc_decode_rows): the plan tensor, one argument less.
  static tvm::ffi::Tensor decode_alloc(TensorView req_pool_indices, TensorView req_to_token,
                                       TensorView full_to_state, TensorView seq_lens, int64_t swa_page_size,
                                       int64_t ring_size, bool use_req_ring) {
    tvm::ffi::Tensor out = alloc_decode_rows(req_pool_indices);
    decode_checked(out, req_pool_indices, req_to_token, full_to_state, seq_lens, swa_page_size, ring_size,
                   use_req_ring);
    return out;
  }

  static void prefill_stage1(TensorView plan_c, TensorView plan_w, int64_t num_c, int64_t num_w,
                             TensorView req_pool_indices, TensorView req_to_token,
                             TensorView full_to_state, int64_t swa_page_size, int64_t ring_size,
                             bool use_req_ring) {
    const Rows r = stage1_common(plan_c, plan_w, num_c, num_w, req_pool_indices, write_row_bytes(false));
    PrefillStage1Args args{};
    args.addr = make_addressing<kRatio>(req_to_token, full_to_state, swa_page_size, ring_size,
                                        use_req_ring, r.dev);
    if (r.rows == 0 && r.rows_w == 0) return;
    fill_stage1(args, r, plan_c, plan_w, num_c, num_w, req_pool_indices);
    chk::launch_on(r.dev, &Launch::prefill_stage1, args);
  }

  static void prefill_device(TensorView plan_c, TensorView plan_w, TensorView workspace,
                             TensorView req_pool_indices, TensorView seq_lens,
                             TensorView extend_lens, TensorView req_to_token,
                             TensorView full_to_state, int64_t swa_page_size, int64_t ring_size,
                             bool use_req_ring) {
    const Rows r = device_common(plan_c, plan_w, workspace, req_pool_indices, seq_lens,
                                 extend_lens, write_row_bytes(false));
    PrefillDeviceArgs args{};
    args.addr = make_addressing<kRatio>(req_to_token, full_to_state, swa_page_size, ring_size,
                                        use_req_ring, r.dev);
    if (r.rows == 0) return;
    fill_device(args, r, plan_c, plan_w, workspace, req_pool_indices, seq_lens, extend_lens);
    chk::launch_on(r.dev, &Launch::prefill_device, args);
  }

  // The eager prefill plan from host lengths and a device world, in one call
  // (plan_host_prefill.h): checks, stage 0 on the host into a pinned slot, device rows from the
  // caller's allocator, H2D copies and stage 1 on the caller's stream; returns [plan_c, plan_w].
  static tvm::ffi::Array<tvm::ffi::Tensor> prefill_host(TensorView seq_lens, TensorView extend_lens,
                                                        TensorView req_pool_indices, TensorView req_to_token,
                                                        TensorView full_to_state, int64_t swa_page_size,
                                                        int64_t ring_size, bool use_req_ring,
                                                        int64_t num_q_tokens, bool pad) {
    namespace pe = ::flashcompress::plan_eager;
    const DLDevice dev = pe::check_slots(req_pool_indices);
    const int64_t batch = req_pool_indices.size(0);
    pe::check_table(req_to_token, "req_to_token", chk::kInt32, 2, dev);
    pe::check_table(full_to_state, "full_to_state", chk::kInt64, 1, dev);
    pe::check_host_lengths(seq_lens, "seq_lens", batch);
    pe::check_host_lengths(extend_lens, "extend_lens", batch);
    pe::check_ring<kRatio>(ring_size, swa_page_size, use_req_ring);
    const plan_host::Lengths len = pe::check_length_values(seq_lens, extend_lens, num_q_tokens, req_to_token.size(1));
    PrefillStage1Args args{};
    args.addr = make_addressing<kRatio>(req_to_token, full_to_state, swa_page_size, ring_size, use_req_ring, dev);
    args.req_pool_indices = static_cast<const int64_t*>(req_pool_indices.data_ptr());
    args.batch = batch;
    const plan_host::Addressing host_addr{swa_page_size, ring_size, kRatio == 4 && !use_req_ring};
    chk::GpuDeviceGuard guard(dev.device_id);
    return pe::upload<CompressPlan, WritePlan>(
        dev, num_q_tokens, pad,
        [&](CompressPlan* c, WritePlan* w) { return plan_host::regular_stage0<kRatio>(len, host_addr, c, w); },
        [&](tvm::ffi::Tensor& c, tvm::ffi::Tensor& w, const plan_host::Counts& n, gpuStream_t stream) {
          args.plan_c = static_cast<CompressPlan*>(c.data_ptr());
          args.plan_w = static_cast<WritePlan*>(w.data_ptr());
          args.rows_c = c.size(0);
          args.num_c = n.compress_rows;
          args.rows_w = w.size(0);
          args.num_w = n.write_rows;
          FC_CHECK_GPU_ERROR(Launch::prefill_stage1(args, stream));
        });
  }

  static tvm::ffi::String layout_info() { return layout_json<kRatio, false>(); }
};

// Online C128 variant (state slots rid + state_slot_offset; no addressing tables).
template <int kRatio>
struct PlanBinding<kRatio, true> {
  using Launch = PlanLaunch<kRatio, true>;

  static void decode(TensorView out, TensorView req_pool_indices, TensorView seq_lens,
                     int64_t state_slot_offset) {
    const Rows r = decode_common(out, req_pool_indices, seq_lens);
    chk::check_range(state_slot_offset, "state_slot_offset", 0, kInt32Max);
    if (r.batch == 0) return;
    OnlineDecodeArgs args{};
    fill_decode(args, r, out, req_pool_indices, seq_lens);
    args.addr.state_slot_offset = state_slot_offset;
    chk::launch_on(r.dev, &Launch::decode, args);
  }

  // decode after the API's checks of req_to_token (int32 [R, L], contiguous, on the output's device)
  // and of the offset (write slots rid + offset, rid < R, fit an int32): the eager path of
  // CompressorDecodePlan.generate_online (flashcompress.fastpath).
  static void decode_checked(TensorView out, TensorView req_pool_indices, TensorView req_to_token,
                             TensorView seq_lens, int64_t state_slot_offset) {
    const DLDevice dev = output_device(out, "out", chk::kGpuDeviceType);
    chk::check_dtype(req_to_token, "req_to_token", chk::kInt32);
    chk::check_ndim(req_to_token, "req_to_token", 2);
    chk::check_contiguous(req_to_token, "req_to_token");
    chk::check_same_device(req_to_token, "req_to_token", dev);
    chk::check_range(state_slot_offset, "state_slot_offset", 0, kInt32Max - req_to_token.size(0));
    decode(out, req_pool_indices, seq_lens, state_slot_offset);
  }

  // decode_checked into rows it allocates (alloc_decode_rows).
  static tvm::ffi::Tensor decode_alloc(TensorView req_pool_indices, TensorView req_to_token, TensorView seq_lens,
                                       int64_t state_slot_offset) {
    tvm::ffi::Tensor out = alloc_decode_rows(req_pool_indices);
    decode_checked(out, req_pool_indices, req_to_token, seq_lens, state_slot_offset);
    return out;
  }

  static void prefill_stage1(TensorView plan_c, TensorView plan_w, int64_t num_c, int64_t num_w,
                             TensorView req_pool_indices, int64_t state_slot_offset) {
    const Rows r = stage1_common(plan_c, plan_w, num_c, num_w, req_pool_indices, write_row_bytes(true));
    chk::check_range(state_slot_offset, "state_slot_offset", 0, kInt32Max);
    if (r.rows == 0 && r.rows_w == 0) return;
    OnlinePrefillStage1Args args{};
    fill_stage1(args, r, plan_c, plan_w, num_c, num_w, req_pool_indices);
    args.addr.state_slot_offset = state_slot_offset;
    chk::launch_on(r.dev, &Launch::prefill_stage1, args);
  }

  static void prefill_device(TensorView plan_c, TensorView plan_w, TensorView workspace,
                             TensorView req_pool_indices, TensorView seq_lens,
                             TensorView extend_lens, int64_t state_slot_offset) {
    const Rows r = device_common(plan_c, plan_w, workspace, req_pool_indices, seq_lens,
                                 extend_lens, write_row_bytes(true));
    chk::check_range(state_slot_offset, "state_slot_offset", 0, kInt32Max);
    if (r.rows == 0) return;
    OnlinePrefillDeviceArgs args{};
    fill_device(args, r, plan_c, plan_w, workspace, req_pool_indices, seq_lens, extend_lens);
    args.addr.state_slot_offset = state_slot_offset;
    chk::launch_on(r.dev, &Launch::prefill_device, args);
  }

  // The eager online prefill plan from host lengths and a device world, in one call (as the
  // regular prefill_host; write slots rid + state_slot_offset, offset <= INT32_MAX - R).
  static tvm::ffi::Array<tvm::ffi::Tensor> prefill_host(TensorView seq_lens, TensorView extend_lens,
                                                        TensorView req_pool_indices, TensorView req_to_token,
                                                        int64_t num_q_tokens, bool pad, int64_t state_slot_offset) {
    namespace pe = ::flashcompress::plan_eager;
    const DLDevice dev = pe::check_slots(req_pool_indices);
    const int64_t batch = req_pool_indices.size(0);
    pe::check_table(req_to_token, "req_to_token", chk::kInt32, 2, dev);
    pe::check_host_lengths(seq_lens, "seq_lens", batch);
    pe::check_host_lengths(extend_lens, "extend_lens", batch);
    chk::check_range(state_slot_offset, "state_slot_offset", 0, kInt32Max - req_to_token.size(0));
    const plan_host::Lengths len = pe::check_length_values(seq_lens, extend_lens, num_q_tokens, req_to_token.size(1));
    OnlinePrefillStage1Args args{};
    args.addr.state_slot_offset = state_slot_offset;
    args.req_pool_indices = static_cast<const int64_t*>(req_pool_indices.data_ptr());
    args.batch = batch;
    chk::GpuDeviceGuard guard(dev.device_id);
    return pe::upload<CompressPlan, CompressPlan>(
        dev, num_q_tokens, pad,
        [&](CompressPlan* c, CompressPlan* w) { return plan_host::online_stage0(len, c, w); },
        [&](tvm::ffi::Tensor& c, tvm::ffi::Tensor& w, const plan_host::Counts& n, gpuStream_t stream) {
          args.plan_c = static_cast<CompressPlan*>(c.data_ptr());
          args.plan_w = static_cast<CompressPlan*>(w.data_ptr());
          args.rows_c = c.size(0);
          args.num_c = n.compress_rows;
          args.rows_w = w.size(0);
          args.num_w = n.write_rows;
          FC_CHECK_GPU_ERROR(Launch::prefill_stage1(args, stream));
        });
  }

  static tvm::ffi::String layout_info() { return layout_json<kRatio, true>(); }
};

}  // namespace plan_binding
}  // namespace flashcompress
