// selftest.cuh — the test-only kernels: the JIT engine's own test kernel and a probe of the
// device encoders (neither is part of the compressor).
//
// add_value: out[i] = in[i] + kValue for float32 vectors of length n.
//   in, out : float32 [n], contiguous, same device
// One thread per element, kBlock threads per block.  The host-side reference
// (add_value_host) lets engine tests call a built module without a GPU.
//
// quant_probe: the device paths of quant.cuh's encoders over n fp32 values (n % 4 == 0):
//   out[i] (4 bytes) = pack_fp8x4 code of x[i], e2m1_threshold(x[i]), bf16 bits of x[i]
//   (little-endian u16, from bf16x2_bits of the pair 2k, 2k + 1 holding x[i]).
// Thread t encodes x[4t .. 4t+3], kBlock threads per block.
// Included by both the kernel TU (nvcc/hipcc) and the binding TU (host compiler); the GPU
// runtime names (gpuError_t, gpuStream_t, ...) come from gpu_runtime.h.
#pragma once

#include <cstdint>

#include "gpu_runtime.h"
#include "launch.h"
#include "quant.cuh"

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
  return launch_kernel(add_value_kernel<kValue, kBlock>, {static_cast<unsigned>(grid), kBlock}, stream, in, out, n);
}

template <int kBlock>
__global__ void __launch_bounds__(kBlock) quant_probe_kernel(const float* x, uint8_t* out, int64_t n) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (4 * t >= n) return;
  const float* xs = x + 4 * t;
  const uint32_t fp8 = quant::pack_fp8x4(xs[0], xs[1], xs[2], xs[3]);
  for (int i = 0; i < 4; ++i) {
    uint8_t* o = out + 4 * (4 * t + i);
    const uint32_t pair = quant::bf16x2_bits(xs[i & ~1], xs[i | 1]);  // the packed pair path
    const uint16_t b = static_cast<uint16_t>((i & 1) ? pair >> 16 : pair);
    o[0] = static_cast<uint8_t>(fp8 >> (8 * i));
    o[1] = static_cast<uint8_t>(quant::e2m1_threshold(xs[i]));
    o[2] = static_cast<uint8_t>(b & 0xFF);
    o[3] = static_cast<uint8_t>(b >> 8);
  }
}

template <int kBlock>
inline gpuError_t launch_quant_probe(const float* x, uint8_t* out, int64_t n, gpuStream_t stream) {
  if (n <= 0) return gpuSuccess;
  const int64_t grid = (n / 4 + kBlock - 1) / kBlock;
  return launch_kernel(quant_probe_kernel<kBlock>, {static_cast<unsigned>(grid), kBlock}, stream, x, out, n);
}
#endif

}  // namespace selftest
}  // namespace flashcompress
