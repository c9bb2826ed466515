// selftest.cuh — the JIT engine's own test kernel (not part of the compressor).
//
// add_value: out[i] = in[i] + kValue for float32 vectors of length n.
//   in, out : float32 [n], contiguous, same device
// One thread per element, kBlock threads per block.  The host-side reference
// (add_value_host) lets engine tests call a built module without a GPU.
// Included by both the kernel TU (nvcc/hipcc) and the binding TU (host compiler); the GPU
// runtime names (gpuError_t, gpuStream_t, ...) come from gpu_runtime.h.
#pragma once

#include <cstdint>

#include "gpu_runtime.h"

#if defined(__CUDACC__) || defined(__HIPCC__)
#define FC_SELFTEST_HD __host__ __device__
#else
#define FC_SELFTEST_HD
#endif

namespace flashcompress {
namespace selftest {

template <int kValue>
FC_SELFTEST_HD inline float add_value_one(float x) {
  return x + static_cast<float>(kValue);
}

template <int kValue>
inline void add_value_host(const float* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = add_value_one<kValue>(in[i]);
}

#if defined(__CUDACC__) || defined(__HIPCC__)
template <int kValue, int kBlock>
__global__ void __launch_bounds__(kBlock) add_value_kernel(const float* __restrict__ in,
                                                           float* __restrict__ out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (i < n) out[i] = add_value_one<kValue>(in[i]);
}

template <int kValue, int kBlock>
inline gpuError_t launch_add_value(const float* in, float* out, int64_t n, gpuStream_t stream) {
  // Whole NVIDIA warps; on wave64 AMD targets a 32-multiple that is not a 64-multiple leaves
  // half a wavefront idle, which is legal (the kernel has no cross-lane code).
  static_assert(kBlock > 0 && kBlock <= 1024 && kBlock % 32 == 0,
                "selftest: block must be a positive multiple of 32, at most 1024");
  if (n == 0) return gpuSuccess;
  const int64_t grid = (n + kBlock - 1) / kBlock;
  add_value_kernel<kValue, kBlock><<<static_cast<unsigned>(grid), kBlock, 0, stream>>>(in, out, n);
  return gpuGetLastError();
}
#endif

}  // namespace selftest
}  // namespace flashcompress
