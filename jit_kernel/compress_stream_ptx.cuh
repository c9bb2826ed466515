// flashcompress: the sm_90 primitives of the streaming C128 prefill (compress_stream.cuh), next
// to ptx.cuh's mbarrier basics (mbar_init, mbar_init_fence, mbar_arrive_expect, mbar_wait):
//
//   bulk_copy_g2s(smem, gmem, bytes, bar)  one 1-D bulk copy (cp.async.bulk, TMA) of `bytes`
//                                         (a multiple of 16; both addresses 16-byte aligned)
//                                         global -> this block's shared memory, completing
//                                         `bytes` of the transaction count of *bar
//   mbar_arrive(bar)                      a plain arrival on a local mbarrier (release)
//   named_sync<kId, kThreads>()           bar.sync on named barrier kId (not 0, which
//                                         __syncthreads uses) over the first kThreads threads
// Without sm_90 each is a no-op (the streaming tiling is only instantiated where
// kHasClusters holds: CUDA sm_90+).
#pragma once

#include <cstdint>

#include "ptx.cuh"

namespace flashcompress {

#if defined(__CUDACC__) || defined(__HIPCC__)

__device__ __forceinline__ void bulk_copy_g2s(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
#if FC_CUDA_DEVICE_ARCH >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_addr(smem)),
      "l"(gmem), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
#else
  (void)smem;
  (void)gmem;
  (void)bytes;
  (void)bar;
#endif
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#if FC_CUDA_DEVICE_ARCH >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
#else
  (void)bar;
#endif
}

template <int kId, int kThreads>
__device__ __forceinline__ void named_sync() {
  static_assert(kId > 0 && kId < 16 && kThreads % 32 == 0, "named barrier 1..15 over whole warps");
#if FC_CUDA_DEVICE_ARCH >= 900
  asm volatile("bar.sync %0, %1;" ::"n"(kId), "n"(kThreads) : "memory");
#endif
}

#endif  // __CUDACC__ || __HIPCC__

}  // namespace flashcompress
