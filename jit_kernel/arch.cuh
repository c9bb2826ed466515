// flashcompress: the device-side differences between CUDA and HIP targets, behind small shims,
// so that kernel bodies carry no FC_GPU_HIP branches (device code; kernel TUs only).
//
//   kHasClusters                 the target has thread block clusters (CUDA sm_90+)
//   launch_min_blocks(s, c, t)   __launch_bounds__' second argument for blocks of t threads:
//                                s resident per SM on CUDA, c per CU on HIP (as waves per SIMD)
//   shfl_xor(v, mask, width)     butterfly exchange within aligned groups of `width` <= 32 lanes
//   shfl_idx(v, src, width)      lane `src` of the caller's aligned group of `width` <= 32 lanes
//   lane32_sync()                orders shared-memory accesses of one aligned 32-lane group
//                                (a warp on CUDA, half a wave64 or a wave32 on HIP)
//   fast_exp(x)                  exp(x) by the target's approximate exponential
//
// Lane groups are at most 32 wide, so code written against these shims runs on 32-lane warps and
// 64-lane wavefronts alike.
#pragma once

#include "gpu_runtime.h"

namespace flashcompress {

inline constexpr bool kHasClusters = FC_HAS_CLUSTERS && !FC_GPU_HIP;

constexpr int launch_min_blocks(int blocks_per_sm, int blocks_per_cu, int threads) {
#if FC_GPU_HIP
  // A CDNA CU has 4 SIMDs and runs wave64: c blocks of t threads are c * t / 256 waves per SIMD.
  (void)blocks_per_sm;
  return blocks_per_cu * threads / 256 > 1 ? blocks_per_cu * threads / 256 : 1;
#else
  (void)blocks_per_cu;
  (void)threads;
  return blocks_per_sm;
#endif
}

#if defined(__CUDACC__) || defined(__HIPCC__)
template <class T>
__device__ __forceinline__ T shfl_xor(T v, int mask, int width) {
#if FC_GPU_HIP
  return __shfl_xor(v, mask, width);
#else
  return __shfl_xor_sync(0xffffffffu, v, mask, width);
#endif
}

template <class T>
__device__ __forceinline__ T shfl_idx(T v, int src, int width) {
#if FC_GPU_HIP
  return __shfl(v, src, width);
#else
  return __shfl_sync(0xffffffffu, v, src, width);
#endif
}

__device__ __forceinline__ void lane32_sync() {
#if FC_GPU_HIP
  // 32 aligned lanes of one wavefront execute in lockstep: order their shared-memory accesses
  // (wavefront-scope fences) and keep the compiler from moving them across (wave barrier).
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#else
  __syncwarp();
#endif
}

// CUDA: 2^(x log2 e) by ex2.approx, subnormal results flushed to zero (__expf adds a range
// fix-up for subnormal results). exp(0) is exactly 1 and exp(-inf) exactly 0 on every target.
__device__ __forceinline__ float fast_exp(float x) {
#if FC_CUDA_DEVICE_ARCH > 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
  return y;
#else
  return __expf(x);
#endif
}
#endif

}  // namespace flashcompress
