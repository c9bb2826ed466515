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
// Kernel launches: launch.h (launch_kernel, one path for every family).
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

// FC_CUDA_DEVICE_ARCH: __CUDA_ARCH__ in the device pass of a CUDA compile, else 0 (host passes,
// HIP), so that `#if FC_CUDA_DEVICE_ARCH >= 900` guards an NVIDIA instruction.
#if !FC_GPU_HIP && defined(__CUDA_ARCH__)
#define FC_CUDA_DEVICE_ARCH __CUDA_ARCH__
#else
#define FC_CUDA_DEVICE_ARCH 0
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

#endif

}  // namespace flashcompress
