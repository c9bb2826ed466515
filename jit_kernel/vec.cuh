// flashcompress: vector loads/stores, dtype conversion to fp32 and lane-group reductions shared
// by the compress and store kernels (device code; included by kernel TUs only).
//
//   Vec<T, N>            N elements of T in one aligned register bundle (16 B for fp32 x4,
//                        8 B for bf16 x4); load_vec / store_vec move one bundle with one access.
//   to_float(T) / from_float<T>(float)   fp32 <-> fp32 / bf16 (RNE), exact on both sides.
//   group_sum<W>(v), group_max<W>(v)     xor-butterfly over aligned groups of W lanes
//                        (W a power of two <= 32); every lane of the group gets the result.
//                        group_sum takes float or double.
//   async_copy<B>(smem, gmem), async_commit(), async_wait<N>()   B (4, 8, 16) bytes global ->
//                        shared without holding registers (cp.async, sm_80+; HIP: a plain copy).
//                        Only the issuing thread may read the bytes, after async_wait<N> has
//                        returned with at most N newer groups still in flight.
//
// Lane groups are at most 32 wide, so the code is the same on 32-lane NVIDIA warps and on
// 64-lane CDNA wavefronts (a 32-lane group is half a wavefront there; shuffles take width W).
#pragma once

#include "gpu_runtime.h"

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

// Lane exchange of a float or a double (fp64 sums of the store's RMSNorm).
template <typename T>
__device__ __forceinline__ T shfl_xor(T v, int mask, int width) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "shfl_xor: float or double");
#if FC_GPU_HIP
  return __shfl_xor(v, mask, width);
#else
  return __shfl_xor_sync(0xffffffffu, v, mask, width);
#endif
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

// Asynchronous global -> shared copies (the compress kernel's staging: its copy share, the bias,
// the store's weight and RoPE row). A thread reads back only what it copied itself, so
// async_wait is the only synchronisation a stage needs.
template <int kBytes>
__device__ __forceinline__ void async_copy(void* smem, const void* gmem) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
#if !FC_GPU_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(dst), "l"(gmem), "n"(kBytes) : "memory");
#else
  using Word = Vec<uint32_t, kBytes / 4>;
  *static_cast<Word*>(smem) = *static_cast<const Word*>(gmem);
#endif
}

__device__ __forceinline__ void async_commit() {
#if !FC_GPU_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Wait until at most kPending of this thread's most recent commit groups are still in flight.
template <int kPending>
__device__ __forceinline__ void async_wait() {
#if !FC_GPU_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}

}  // namespace flashcompress
