// flashcompress: vector loads/stores, dtype conversion to fp32 and lane-group reductions shared
// by the compress and store kernels (device code; included by kernel TUs only).
//
//   Vec<T, N>            N elements of T in one aligned register bundle (16 B for fp32 x4,
//                        8 B for bf16 x4); load_vec / store_vec move one bundle with one access.
//   to_float(T) / from_float<T>(float)   fp32 <-> fp32 / bf16 (RNE), exact on both sides.
//   group_sum<W>(v), group_max<W>(v)     xor-butterfly over aligned groups of W lanes
//                        (W a power of two <= 32); every lane of the group gets the result.
//                        group_sum takes float or double.
//   shuffles and lane-group sync: arch.cuh; cp.async staging (async_copy): ptx.cuh (included here).
//
// Lane groups are at most 32 wide, so the code is the same on 32-lane NVIDIA warps and on
// 64-lane CDNA wavefronts (a 32-lane group is half a wavefront there; shuffles take width W).
#pragma once

#include "arch.cuh"
#include "gpu_runtime.h"
#include "ptx.cuh"

#if FC_GPU_HIP
#include "quant.cuh"  // bf16 <-> fp32 (our own helpers: HIP 5.2 has no hip_bf16.h)
#else
#include <cuda_bf16.h>
#endif

#include <cstdint>
#include <type_traits>

namespace flashcompress {

#if FC_GPU_HIP
// bf16 bit pattern; converted by quant.cuh's bf16_bits (RNE, NaN -> 0x7FFF, as
// __float2bfloat16_rn on CUDA) and bf16_to_float.
struct alignas(2) bf16_t {
  uint16_t bits;
};
#else
using bf16_t = __nv_bfloat16;
#endif

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& x) {
  *reinterpret_cast<Vec<T, N>*>(p) = x;
}

__device__ __forceinline__ float to_float(float x) { return x; }
#if FC_GPU_HIP
__device__ __forceinline__ float to_float(bf16_t x) { return quant::bf16_to_float(x.bits); }
#else
__device__ __forceinline__ float to_float(bf16_t x) { return static_cast<float>(x); }
#endif

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16_t from_float<bf16_t>(float x) {
#if FC_GPU_HIP
  return bf16_t{quant::bf16_bits(x)};
#else
  return __float2bfloat16_rn(x);
#endif
}

// Value as the peer's mixed kernels see it: stored dtype -> TIn -> fp32.
template <typename TIn, typename TStore>
__device__ __forceinline__ float via(TStore x) {
  return to_float(from_float<TIn>(to_float(x)));
}

// op-reduction over aligned groups of W lanes, xor butterfly with masks W/2, ..., 1.
template <int W, typename T, typename Op>
__device__ __forceinline__ T group_reduce(T v, Op op) {
  static_assert(W >= 1 && W <= 32 && (W & (W - 1)) == 0, "lane group must be a power of two <= 32");
#pragma unroll
  for (int m = W / 2; m >= 1; m /= 2) v = op(v, shfl_xor(v, m, W));
  return v;
}

// group_sum in fp64 is the store's RMSNorm sum of squares: fp32 squares are exact in fp64, so
// the sum is the exact one up to a few fp64 roundings, whatever the lane order.
template <int W, typename T>
__device__ __forceinline__ T group_sum(T v) {
  return group_reduce<W>(v, [](T a, T b) { return a + b; });
}

template <int W>
__device__ __forceinline__ float group_max(float v) {
  return group_reduce<W>(v, [](float a, float b) { return fmaxf(a, b); });
}

}  // namespace flashcompress
