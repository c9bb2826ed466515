// flashcompress: the eager prefill planner of the `plan` family, host part (binding TU only).
//
// CompressorPrefillPlan.generate / generate_online with host lengths (seq_lens / extend_lens on
// the CPU) and the world (req_pool_indices, req_to_token, full_to_state) on a GPU build their
// plan in one native call (PlanBinding::prefill_host, plan_binding.h):
//   1. the checks of the API for that case (flashcompress.validation, same messages, same
//      order), before anything is written: tensors, scalars, then the length values
//      (0 < extend <= seq, sum(extend) == num_q_tokens, seq <= columns of req_to_token);
//   2. stage 0 on the host (plan_host.h) into a pinned staging slot (pinned_ring.h):
//      compress rows at offset 0, write rows at offset num_q_tokens * 16;
//   3. the device rows from the caller's allocator (TVMFFIEnvTensorAlloc: torch's), exact row
//      counts, or num_q_tokens rows each with `pad` (use_cuda_graph);
//   4. two async H2D copies of the real rows on the caller's current stream, the slot's event,
//      then the stage-1 kernel (which writes the sentinel rows past the counts).
// An empty batch and a capturing stream are refused (ValueError) before anything is written: the
// Python path then returns its empty plans / runs as before.
#pragma once

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "ffi_check.h"
#include "gpu_runtime.h"
#include "layout.h"
#include "pinned_ring.h"
#include "plan.cuh"
#include "plan_host.h"

namespace flashcompress {
namespace plan_eager {

namespace chk = ::flashcompress::ffi_check;
using tvm::ffi::TensorView;

inline constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// req_pool_indices: int64 [B], contiguous, on a GPU (the plan's device); returns that device.
inline DLDevice check_slots(const TensorView& rids) {
  chk::check_device_type(rids, "req_pool_indices", chk::kGpuDeviceType);
  chk::check_dtype(rids, "req_pool_indices", chk::kInt64);
  chk::check_ndim(rids, "req_pool_indices", 1);
  chk::check_contiguous(rids, "req_pool_indices");
  return rids.device();
}

// A table of the world: `dtype`, `ndim`-D, contiguous, on `dev`.
inline void check_table(const TensorView& t, const char* name, DLDataType dtype, int32_t ndim, DLDevice dev) {
  chk::check_dtype(t, name, dtype);
  chk::check_ndim(t, name, ndim);
  chk::check_same_device(t, name, dev);
  chk::check_contiguous(t, name);
}

// A length list: int64 [batch], contiguous host memory.
inline void check_host_lengths(const TensorView& t, const char* name, int64_t batch) {
  chk::check_dtype(t, name, chk::kInt64);
  chk::check_ndim(t, name, 1);
  const auto type = t.device().device_type;
  if (type != kDLCPU && type != kDLCUDAHost && type != kDLROCMHost) TVM_FFI_THROW(ValueError)
      << name << ": expected a tensor in host memory (cpu or pinned), got one on " << chk::device_name(t.device());
  chk::check_contiguous(t, name);
  if (t.size(0) != batch) TVM_FFI_THROW(ValueError)
      << name << ": expected shape[0] == " << batch << " (one per request), got shape (" << t.size(0) << ",)";
}

// validation.check_prefill_lengths (host lengths: exact total) and check_positions_in_table, in
// their order; the batch is not empty.
inline plan_host::Lengths check_length_values(const TensorView& seq_lens, const TensorView& extend_lens,
                                              int64_t num_q_tokens, int64_t max_ctx) {
  const int64_t batch = seq_lens.size(0);
  if (batch <= 0) {
    TVM_FFI_THROW(ValueError) << "req_pool_indices: expected a non-empty batch (the API returns empty plans "
                                 "for an empty one), got batch size 0";
  }
  if (num_q_tokens < 0) TVM_FFI_THROW(ValueError) << "num_q_tokens: expected >= 0, got " << num_q_tokens;
  if (num_q_tokens > kMaxRaggedId) TVM_FFI_THROW(ValueError)
      << "num_q_tokens: expected <= " << kMaxRaggedId << " (ragged ids are u16), got " << num_q_tokens;
  if (num_q_tokens < batch) TVM_FFI_THROW(ValueError)
      << "num_q_tokens: expected >= batch size " << batch << ", got " << num_q_tokens;
  const plan_host::Lengths len{static_cast<const int64_t*>(seq_lens.data_ptr()),
                               static_cast<const int64_t*>(extend_lens.data_ptr()), batch};
  int64_t total = 0, longest = std::numeric_limits<int64_t>::min();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t e = len.extend_lens[b], s = len.seq_lens[b];
    if (e <= 0 || e > s) {
      TVM_FFI_THROW(ValueError) << "extend_lens: expected 0 < extend_lens[i] <= seq_lens[i] for every request, got "
                                << "extend_lens[" << b << "] = " << e << ", seq_lens[" << b << "] = " << s;
    }
    total += e;
    longest = std::max(longest, s);
  }
  if (total != num_q_tokens) TVM_FFI_THROW(ValueError)
      << "num_q_tokens: expected sum(extend_lens) = " << total << ", got " << num_q_tokens;
  if (longest > max_ctx) TVM_FFI_THROW(ValueError)
      << "seq_lens: expected values <= " << max_ctx << " (columns of req_to_token), got max " << longest;
  return len;
}

// validation.check_ring for a regular variant (the Python types were checked by the caller).
template <int kRatio>
void check_ring(int64_t ring_size, int64_t swa_page_size, bool use_req_ring) {
  if (ring_size < 1) TVM_FFI_THROW(ValueError) << "ring_size: expected >= 1, got " << ring_size;
  if (swa_page_size < 1) TVM_FFI_THROW(ValueError) << "swa_page_size: expected >= 1, got " << swa_page_size;
  if (use_req_ring && kRatio != 4) TVM_FFI_THROW(ValueError)
      << "use_req_ring: expected False for ratio 128 (ratio 128 always uses the request ring), got True";
  if (ring_size % kRatio != 0) TVM_FFI_THROW(ValueError)
      << "ring_size: expected a multiple of compress_ratio " << kRatio << ", got " << ring_size;
  const bool paged = kRatio == 4 && !use_req_ring;
  if (paged && swa_page_size % ring_size != 0) TVM_FFI_THROW(ValueError)
      << "swa_page_size: expected a multiple of ring_size " << ring_size << ", got " << swa_page_size;
}

// uint8 [rows, row_bytes] on `dev` from the caller's allocator.
inline tvm::ffi::Tensor alloc_rows(int64_t rows, int64_t row_bytes, DLDevice dev) {
  const int64_t shape[2] = {rows, row_bytes};
  return tvm::ffi::Tensor::FromEnvAlloc(TVMFFIEnvTensorAlloc, tvm::ffi::ShapeView(shape, 2), chk::kUInt8, dev);
}

// Steps 2-4 of the header: `stage0(host_c, host_w)` writes the stage-0 rows and returns the
// counts; `stage1(plan_c, plan_w, counts, stream)` launches stage 1 on the device rows. The
// device of `dev` must be current (GpuDeviceGuard).
template <typename CompressRow, typename WriteRow, typename Stage0, typename Stage1>
tvm::ffi::Array<tvm::ffi::Tensor> upload(DLDevice dev, int64_t num_q_tokens, bool pad, Stage0&& stage0,
                                         Stage1&& stage1) {
  const gpuStream_t stream = chk::stream_of(dev);
  // A captured copy would read its ring slot at every replay, long after the slot was reused.
  bool capturing = false;
  FC_CHECK_GPU_ERROR(pinned::stream_capturing(stream, &capturing));
  if (capturing) {
    TVM_FFI_THROW(ValueError) << "stream: expected a stream that is not being captured (host-length plans are "
                                 "eager; capture the device-length planner), got a capturing one";
  }
  const size_t c_bytes = static_cast<size_t>(num_q_tokens) * sizeof(CompressRow);
  const size_t w_bytes = static_cast<size_t>(num_q_tokens) * sizeof(WriteRow);
  pinned::PinnedRing& ring = pinned::ring_of(dev.device_id);
  std::lock_guard<std::mutex> lock(ring.mutex);
  pinned::PinnedSlot& slot = ring.acquire(c_bytes + w_bytes);
  auto* host_c = static_cast<CompressRow*>(slot.host);
  auto* host_w = reinterpret_cast<WriteRow*>(static_cast<char*>(slot.host) + c_bytes);
  const plan_host::Counts counts = stage0(host_c, host_w);
  tvm::ffi::Tensor plan_c = alloc_rows(pad ? num_q_tokens : counts.compress_rows, sizeof(CompressRow), dev);
  tvm::ffi::Tensor plan_w = alloc_rows(pad ? num_q_tokens : counts.write_rows, sizeof(WriteRow), dev);
  {
    const pinned::SlotRelease release(slot, stream);  // the slot's event, after the copies (also on a throw)
    if (counts.compress_rows > 0) {
      FC_CHECK_GPU_ERROR(
          pinned::copy_h2d(plan_c.data_ptr(), host_c, counts.compress_rows * sizeof(CompressRow), stream));
    }
    if (counts.write_rows > 0) {
      FC_CHECK_GPU_ERROR(pinned::copy_h2d(plan_w.data_ptr(), host_w, counts.write_rows * sizeof(WriteRow), stream));
    }
  }
  if (plan_c.size(0) > 0 || plan_w.size(0) > 0) stage1(plan_c, plan_w, counts, stream);
  return tvm::ffi::Array<tvm::ffi::Tensor>{plan_c, plan_w};
}

}  // namespace plan_eager
}  // namespace flashcompress
