// flashcompress: the one GPU-runtime shim of the JIT kernels (CUDA or HIP, fixed at compile time).
//
// Every kernel header and binding TU includes this instead of <cuda_runtime.h> or
// <hip/hip_runtime.h> and spells runtime types and calls through the names below, so that one
// source builds for either backend. No tvm-ffi here: kernel TUs include it (ffi_check.h has the
// binding-side helpers: error check macro and device guard).
//
// Backend selection (once, by the compile command; never mixed within one module):
//   HIP   iff __HIP_PLATFORM_AMD__ or USE_ROCM is defined. The engine's HIP command lines
//         (python/flashcompress/jit/flags.py, build.py) pass -D__HIP_PLATFORM_AMD__=1 to both
//         hipcc (kernel TU; hip-clang defines it too) and the host compiler (binding TU), with
//         HIP_PLATFORM=amd in hipcc's environment. USE_ROCM alone (a PyTorch-style build) gets
//         __HIP_PLATFORM_AMD__ defined here, which the HIP headers require outside hip-clang.
//   CUDA  otherwise (nvcc for kernel TUs, the host compiler for binding TUs). hipcc on the
//         NVIDIA platform (__HIP_PLATFORM_NVIDIA__) is nvcc underneath and takes this branch.
// FC_GPU_HIP is 1 on HIP and 0 on CUDA; FC_GPU_RUNTIME_NAME is "HIP" / "CUDA" (messages).
//
// Names (namespace flashcompress; host-only functions, thin inline wrappers of the runtime):
//   gpuError_t, gpuStream_t, gpuSuccess
//   gpuGetLastError(), gpuGetErrorString(e), gpuGetErrorName(e), gpuGetDevice(&d), gpuSetDevice(d)
//   CUDA only: gpu_launch_ex(kernel, grid, block, cluster, pdl, stream, arg) (cudaLaunchKernelEx
//   with the cluster and programmatic-dependent-launch attributes)
// Kernel launches keep the triple-chevron syntax (kernel<<<grid, block, smem, stream>>>), which
// nvcc and hip-clang both accept; launch configurations are plain unsigned ints.
//
// Warp / wavefront size: 32 lanes on NVIDIA, 64 on CDNA (gfx9: gfx90a, gfx94x), 32 or 64 on
// RDNA. Kernel code must not assume 32 lanes: no 32-bit lane masks, no __shfl*_sync /
// __syncwarp (absent from HIP 5.2 anyway), no "warp-synchronous" shared-memory code. The plan
// kernels (plan_builder.cuh) use only __syncthreads() and shared memory, so they are
// warp-size agnostic; kMaxWarpSize lets a header static_assert that its block sizes are whole
// wavefronts on every target (a partial wavefront is legal, only wasteful). Code that really
// needs the lane count uses the device-side `warpSize` (a constant on HIP, a variable on CUDA).
// Block sizes must stay <= 1024 (the limit on both vendors).
//
// HIP API level: what Debian's HIP 5.2 provides (see ../shared/spec/hip.md): no hip_bf16.h /
// hip_fp8.h, no _sync shuffles. Guard anything newer with HIP_VERSION.
#pragma once

#if defined(__HIP_PLATFORM_AMD__) || defined(USE_ROCM)
#if !defined(__HIP_PLATFORM_AMD__)
#define __HIP_PLATFORM_AMD__ 1
#endif
#define FC_GPU_HIP 1
#define FC_GPU_RUNTIME_NAME "HIP"
#include <hip/hip_runtime.h>
#else
#define FC_GPU_HIP 0
#define FC_GPU_RUNTIME_NAME "CUDA"
#include <cuda_runtime.h>
#endif

// FC_ENABLE_PDL: 1 iff the kernel TU launches its kernels as programmatic dependents (the
// templates set it for CUDA targets sm_90 and up; 0 by default and on HIP).
#ifndef FC_ENABLE_PDL
#define FC_ENABLE_PDL 0
#endif
// FC_HAS_CLUSTERS: 1 iff the target has thread block clusters (the templates set it for CUDA
// targets sm_90 and up; 0 by default and on HIP).
#ifndef FC_HAS_CLUSTERS
#define FC_HAS_CLUSTERS 0
#endif

namespace flashcompress {

// Largest warp / wavefront of any supported target (CDNA wave64).
inline constexpr int kMaxWarpSize = 64;

#if FC_GPU_HIP
using gpuError_t = hipError_t;
using gpuStream_t = hipStream_t;
inline constexpr gpuError_t gpuSuccess = hipSuccess;
inline gpuError_t gpuGetLastError() { return hipGetLastError(); }
inline const char* gpuGetErrorString(gpuError_t e) { return hipGetErrorString(e); }
inline const char* gpuGetErrorName(gpuError_t e) { return hipGetErrorName(e); }
inline gpuError_t gpuGetDevice(int* device) { return hipGetDevice(device); }
inline gpuError_t gpuSetDevice(int device) { return hipSetDevice(device); }
#else
using gpuError_t = cudaError_t;
using gpuStream_t = cudaStream_t;
inline constexpr gpuError_t gpuSuccess = cudaSuccess;
inline gpuError_t gpuGetLastError() { return cudaGetLastError(); }
inline const char* gpuGetErrorString(gpuError_t e) { return cudaGetErrorString(e); }
inline const char* gpuGetErrorName(gpuError_t e) { return cudaGetErrorName(e); }
inline gpuError_t gpuGetDevice(int* device) { return cudaGetDevice(device); }
inline gpuError_t gpuSetDevice(int device) { return cudaSetDevice(device); }

// Launch kernel(arg) on `stream` (grid x block threads, no dynamic shared memory): `cluster`
// blocks per thread block cluster when > 1, and with `pdl` as a programmatic dependent of the
// stream's previous kernel (the kernel must pdl_wait before its first global-memory access).
template <class Arg>
inline gpuError_t gpu_launch_ex(void (*kernel)(Arg), unsigned grid, unsigned block, int cluster, bool pdl,
                                gpuStream_t stream, const Arg& arg) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  unsigned n = 0;
  if (cluster > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = static_cast<unsigned>(cluster);
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, arg);
}
#endif

// Programmatic dependent launch (CUDA, sm_90+; no-ops elsewhere). A kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may start while the previous kernel of its
// stream still runs: it must call pdl_wait() before its first global-memory access (the wait
// returns once every prerequisite grid has completed and its memory is visible; without the
// attribute it returns at once). pdl_launch_dependents() lets the next such kernel of the stream
// start; that kernel's pdl_wait still waits for this grid to complete. Never before this
// kernel's own pdl_wait: a dependent may read, before its wait, what the kernel two back wrote.
#if defined(__CUDACC__) || defined(__HIPCC__)
__device__ __forceinline__ void pdl_wait() {
#if !FC_GPU_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if !FC_GPU_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// When a kernel lets the next one launch: right after its wait (kEarly: pdl_enter) or once a
// block has done its work (pdl_leave). Each kernel chooses (benchmarks/RESULTS.md, session 10:
// early wins where the grid fills every block slot, the standalone store and C4 decode; late
// wins for online C128 decode, whose 512-block grid leaves slots to the next launch's blocks,
// which then wait there). FC_PDL_TRIGGER_AT_ENTRY (an A/B knob, scripts/ab_bench.sh -D): -1 each
// kernel's choice, 0 / 1 late / early everywhere.
#ifndef FC_PDL_TRIGGER_AT_ENTRY
#define FC_PDL_TRIGGER_AT_ENTRY -1
#endif
template <bool kEarly>
inline constexpr bool kPdlEarly = FC_PDL_TRIGGER_AT_ENTRY < 0 ? kEarly : FC_PDL_TRIGGER_AT_ENTRY != 0;

// Before a programmatic dependent's wait: read kernel parameters (one value from each 32-byte
// span of the parameter block, folded by the caller) so that their constant-cache misses overlap
// the previous kernel instead of delaying the first load after the wait (session 11's ncu: 9-11%
// of the stall samples of decode kernels were such misses right after the wait). Lane 0 of each
// warp stores the folded value to a shared sink, an instruction ptxas keeps. An A/B knob:
// FC_PDL_WARM_PARAMS 0 leaves it out.
#ifndef FC_PDL_WARM_PARAMS
#define FC_PDL_WARM_PARAMS 1
#endif
__device__ __forceinline__ void pdl_warm_params(uint64_t folded) {
#if FC_PDL_WARM_PARAMS && !FC_GPU_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ uint64_t sink;
  if ((threadIdx.x & 31) == 0) {
    asm volatile("st.shared.u64 [%0], %1;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(&sink))),
                 "l"(folded));
  }
#else
  (void)folded;
#endif
}

// Fold values of any integer or pointer type for pdl_warm_params.
template <class... T>
__device__ __forceinline__ uint64_t fold_params(T... v) {
  return (uint64_t{0} ^ ... ^ (uint64_t)(v));
}

// The start of a programmatic dependent: wait for the previous kernel (then maybe trigger).
template <bool kEarly>
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  if constexpr (kPdlEarly<kEarly>) pdl_launch_dependents();
}

// A block's work is done: the next kernel may launch (its prologue overlaps this grid's tail).
template <bool kEarly>
__device__ __forceinline__ void pdl_leave() {
  if constexpr (!kPdlEarly<kEarly>) pdl_launch_dependents();
}
#endif

}  // namespace flashcompress
