// flashcompress: inline-PTX primitives of NVIDIA targets, each a no-op (or a plain fallback)
// where the target lacks the instruction (device code; kernel TUs only).
//
//   sm_80+  async_copy<B>(smem, gmem), async_commit(), async_wait<N>()
//           B (4, 8, 16) bytes global -> shared by cp.async, no registers held while they fly.
//           Only the issuing thread may read the bytes, after async_wait<N> has returned with at
//           most N newer groups still in flight. Elsewhere: a plain copy.
//   sm_90   programmatic dependent launch (griddepcontrol): pdl_wait, pdl_launch_dependents,
//           pdl_enter<kEarly> / pdl_leave<kEarly>, pdl_warm_params(fold_params(...))
//   sm_90   thread block clusters: cluster_arrive_relaxed, cluster_wait; mbarriers: mbar_init,
//           mbar_init_fence, mbar_arrive_expect, mbar_wait; distributed shared memory:
//           remote_store_async (mapa + st.async completing bytes of a remote mbarrier)
#pragma once

#include <cstdint>

#include "gpu_runtime.h"

namespace flashcompress {

#if defined(__CUDACC__) || defined(__HIPCC__)

#if FC_CUDA_DEVICE_ARCH >= 800
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#endif

// ---- asynchronous global -> shared copies (sm_80+)

template <int kBytes>
__device__ __forceinline__ void async_copy(void* smem, const void* gmem) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
#if FC_CUDA_DEVICE_ARCH >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(smem_addr(smem)), "l"(gmem), "n"(kBytes) : "memory");
#else
  struct alignas(kBytes) Word {
    uint32_t w[kBytes / 4];
  };
  *static_cast<Word*>(smem) = *static_cast<const Word*>(gmem);
#endif
}

__device__ __forceinline__ void async_commit() {
#if FC_CUDA_DEVICE_ARCH >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Wait until at most kPending of this thread's most recent commit groups are still in flight.
template <int kPending>
__device__ __forceinline__ void async_wait() {
#if FC_CUDA_DEVICE_ARCH >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}

// ---- programmatic dependent launch (sm_90)
// A kernel launched as a programmatic dependent may start while the previous kernel of its
// stream still runs: it calls pdl_wait() before its first global-memory access (the wait returns
// once every prerequisite grid has completed and its memory is visible; without the launch
// attribute it returns at once). pdl_launch_dependents() lets the next dependent of the stream
// start (its own wait still waits for this grid); never before this kernel's own wait, since a
// dependent may read, before its wait, what the kernel two back wrote.

__device__ __forceinline__ void pdl_wait() {
#if FC_CUDA_DEVICE_ARCH >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if FC_CUDA_DEVICE_ARCH >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// A kernel triggers its dependents right after its wait (kEarly: grids that fill every block
// slot) or once a block has done its work (pdl_leave: grids that leave slots to the next launch).
template <bool kEarly>
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  if constexpr (kEarly) pdl_launch_dependents();
}

template <bool kEarly>
__device__ __forceinline__ void pdl_leave() {
  if constexpr (!kEarly) pdl_launch_dependents();
}

// Before the wait: touch the kernel parameters (one value from each 32-byte span, folded by
// fold_params) so that their constant-cache misses overlap the previous kernel. Lane 0 of each
// warp stores the folded value to a shared sink, which keeps the reads alive.
__device__ __forceinline__ void pdl_warm_params(uint64_t folded) {
#if FC_CUDA_DEVICE_ARCH >= 900
  __shared__ uint64_t sink;
  if ((threadIdx.x & 31) == 0) {
    asm volatile("st.shared.u64 [%0], %1;" ::"r"(smem_addr(&sink)), "l"(folded));
  }
#else
  (void)folded;
#endif
}

template <class... T>
__device__ __forceinline__ uint64_t fold_params(T... v) {
  return (uint64_t{0} ^ ... ^ (uint64_t)(v));
}

// ---- thread block clusters, mbarriers, distributed shared memory (sm_90)

// Arrive on the cluster barrier without publishing anything (relaxed).
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if FC_CUDA_DEVICE_ARCH >= 900
  asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
#endif
}

// Wait until every thread of the cluster has arrived at this thread's last phase (acquire).
__device__ __forceinline__ void cluster_wait() {
#if FC_CUDA_DEVICE_ARCH >= 900
  asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
#endif
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
#if FC_CUDA_DEVICE_ARCH >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
#else
  (void)bar;
  (void)count;
#endif
}

// Make the barriers' initialisation visible to the cluster (before the entry arrive).
__device__ __forceinline__ void mbar_init_fence() {
#if FC_CUDA_DEVICE_ARCH >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// Store v into block `rank`'s copy of *dst by an asynchronous remote store that completes 8
// bytes of the transaction count of that block's copy of *bar (no fence: the barrier's phase
// completion makes the bytes visible to its waiters).
__device__ __forceinline__ void remote_store_async(double* dst, uint64_t* bar, double v, uint32_t rank) {
#if FC_CUDA_DEVICE_ARCH >= 900
  uint32_t rdst, rbar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rdst) : "r"(smem_addr(dst)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rbar) : "r"(smem_addr(bar)), "r"(rank));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];" ::"r"(rdst),
               "l"(__double_as_longlong(v)), "r"(rbar)
               : "memory");
#else
  (void)dst;
  (void)bar;
  (void)v;
  (void)rank;
#endif
}

// The local arrival of a phase, expecting `bytes` of asynchronous stores.
__device__ __forceinline__ void mbar_arrive_expect(uint64_t* bar, uint32_t bytes) {
#if FC_CUDA_DEVICE_ARCH >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
#else
  (void)bar;
  (void)bytes;
#endif
}

// Wait until phase `phase` (0 / 1) of the local barrier completes.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t phase) {
#if FC_CUDA_DEVICE_ARCH >= 900
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(phase)
        : "memory");
  } while (!done);
#else
  (void)bar;
  (void)phase;
#endif
}

#endif  // __CUDACC__ || __HIPCC__

}  // namespace flashcompress
