// flashcompress: a small ring of pinned host staging slots per GPU (host code of a binding TU).
//
// The eager prefill planner (plan_binding.h, prefill_host) writes its stage-0 rows on the host
// and copies them to the GPU with an asynchronous H2D copy on the caller's stream. The source of
// such a copy must stay untouched until the copy has run, so the rows go to a slot of this ring:
// kSlots page-locked buffers (cudaHostAlloc / hipHostMalloc, portable), each guarded by an event
// recorded on the stream right after its copy. A slot is handed out again only after its event
// completed (normally long ago: the ring is used round robin), so no copy ever reads a slot that is
// being rewritten. Page-locked allocation (and freeing) synchronises the device, so the first use
// of a ring allocates all its slots at once (kMinBytes each: the rows of a 32k-token chunk), and a
// later call pays that only when a plan needs more bytes than its slot has (the slot is freed and
// reallocated, at least doubling). Rings live for the process (never freed: no teardown-order
// hazard with the GPU runtime) and are guarded by a mutex (callers may run without the GIL).
//
// Use (the device of `device_id` current):
//   std::lock_guard<std::mutex> lock(ring.mutex);
//   PinnedSlot& s = ring.acquire(bytes);      // s.host: >= bytes of pinned memory, free to write
//   ... write rows ...
//   { SlotRelease release(s, stream);         // records s's event on scope exit
//     ... issue copies from s.host on `stream` ... }
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "ffi_check.h"
#include "gpu_runtime.h"

namespace flashcompress {
namespace pinned {

#if FC_GPU_HIP
using gpuEvent_t = hipEvent_t;
inline gpuError_t host_alloc(void** p, size_t n) { return hipHostMalloc(p, n, hipHostMallocPortable); }
inline gpuError_t host_free(void* p) { return hipHostFree(p); }
inline gpuError_t event_create(gpuEvent_t* e) { return hipEventCreateWithFlags(e, hipEventDisableTiming); }
inline gpuError_t event_record(gpuEvent_t e, gpuStream_t s) { return hipEventRecord(e, s); }
inline gpuError_t event_wait_host(gpuEvent_t e) { return hipEventSynchronize(e); }
inline gpuError_t copy_h2d(void* dst, const void* src, size_t n, gpuStream_t s) {
  return hipMemcpyAsync(dst, src, n, hipMemcpyHostToDevice, s);
}
inline gpuError_t stream_drain(gpuStream_t s) { return hipStreamSynchronize(s); }
inline gpuError_t stream_capturing(gpuStream_t s, bool* capturing) {
  hipStreamCaptureStatus status = hipStreamCaptureStatusNone;
  const gpuError_t e = hipStreamIsCapturing(s, &status);
  *capturing = status != hipStreamCaptureStatusNone;
  return e;
}
#else
using gpuEvent_t = cudaEvent_t;
inline gpuError_t host_alloc(void** p, size_t n) { return cudaHostAlloc(p, n, cudaHostAllocPortable); }
inline gpuError_t host_free(void* p) { return cudaFreeHost(p); }
inline gpuError_t event_create(gpuEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDisableTiming); }
inline gpuError_t event_record(gpuEvent_t e, gpuStream_t s) { return cudaEventRecord(e, s); }
inline gpuError_t event_wait_host(gpuEvent_t e) { return cudaEventSynchronize(e); }
inline gpuError_t copy_h2d(void* dst, const void* src, size_t n, gpuStream_t s) {
  return cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s);
}
inline gpuError_t stream_drain(gpuStream_t s) { return cudaStreamSynchronize(s); }
inline gpuError_t stream_capturing(gpuStream_t s, bool* capturing) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const gpuError_t e = cudaStreamIsCapturing(s, &status);
  *capturing = status != cudaStreamCaptureStatusNone;
  return e;
}
#endif

struct PinnedSlot {
  void* host = nullptr;
  size_t bytes = 0;
  gpuEvent_t event = nullptr;
  bool pending = false;  // an event was recorded and not yet waited for
};

class PinnedRing {
 public:
  static constexpr int kSlots = 8;
  static constexpr size_t kMinBytes = size_t{1} << 20;

  std::mutex mutex;

  // The next slot, its previous copy finished, with room for `bytes` (mutex held, device current).
  PinnedSlot& acquire(size_t bytes) {
    if (!allocated_) {  // every slot at once: one synchronising allocation phase, at the first call
      for (PinnedSlot& slot : slots_) {
        if (slot.host == nullptr) {
          FC_CHECK_GPU_ERROR(host_alloc(&slot.host, kMinBytes));
          slot.bytes = kMinBytes;
        }
      }
      allocated_ = true;
    }
    PinnedSlot& s = slots_[next_];
    next_ = (next_ + 1) % kSlots;
    if (s.event == nullptr) FC_CHECK_GPU_ERROR(event_create(&s.event));
    if (s.pending) {
      FC_CHECK_GPU_ERROR(event_wait_host(s.event));
      s.pending = false;
    }
    if (s.bytes < bytes) {
      const size_t grown = std::max({bytes, 2 * s.bytes, kMinBytes});
      if (s.host != nullptr) FC_CHECK_GPU_ERROR(host_free(s.host));
      s.host = nullptr;
      s.bytes = 0;
      FC_CHECK_GPU_ERROR(host_alloc(&s.host, grown));
      s.bytes = grown;
    }
    return s;
  }

 private:
  PinnedSlot slots_[kSlots];
  int next_ = 0;
  bool allocated_ = false;
};

// Releases a slot on scope exit (create it right before the copies from the slot), also when a
// copy throws: the slot is then never rewritten before an issued copy ran. Where the event cannot
// be recorded the stream is drained instead (errors ignored: the throwing step reports its own).
class SlotRelease {
 public:
  SlotRelease(PinnedSlot& slot, gpuStream_t stream) : slot_(slot), stream_(stream) {}
  SlotRelease(const SlotRelease&) = delete;
  SlotRelease& operator=(const SlotRelease&) = delete;
  ~SlotRelease() {
    if (event_record(slot_.event, stream_) == gpuSuccess) {
      slot_.pending = true;
    } else {
      (void)stream_drain(stream_);
    }
  }

 private:
  PinnedSlot& slot_;
  gpuStream_t stream_;
};

// The ring of GPU `device_id` (created on first use, kept for the process).
inline PinnedRing& ring_of(int device_id) {
  static std::mutex* rings_mutex = new std::mutex();
  static auto* rings = new std::unordered_map<int, std::unique_ptr<PinnedRing>>();
  std::lock_guard<std::mutex> lock(*rings_mutex);
  std::unique_ptr<PinnedRing>& r = (*rings)[device_id];
  if (!r) r.reset(new PinnedRing());
  return *r;
}

}  // namespace pinned
}  // namespace flashcompress
