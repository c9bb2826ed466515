// flashcompress: the GPU-runtime shim of the JIT kernels (CUDA or HIP, fixed at compile time).
//
// Kernel headers and binding TUs include this instead of <cuda_runtime.h> / <hip/hip_runtime.h>
// and use the names below (namespace flashcompress): gpuError_t, gpuStream_t, gpuSuccess,
// gpuGetLastError, gpuGetErrorString, gpuGetErrorName, gpuGetDevice, gpuSetDevice. Launches:
// launch.h; device-side differences: arch.cuh.
//
// HIP iff __HIP_PLATFORM_AMD__ or USE_ROCM is defined (the engine's HIP commands pass
// -D__HIP_PLATFORM_AMD__=1 to both TUs, jit/flags.py); CUDA otherwise, hipcc on the NVIDIA
// platform included. FC_GPU_HIP is 1 / 0, FC_GPU_RUNTIME_NAME "HIP" / "CUDA". The HIP API level
// is Debian's HIP 5.2 (no hip_bf16.h / hip_fp8.h, no _sync shuffles). Kernel code must not
// assume 32-lane warps (CDNA runs wave64): no 32-bit lane masks, no warp-synchronous code;
// kMaxWarpSize lets a header check that its blocks are whole wavefronts everywhere.
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

// FC_ENABLE_PDL / FC_HAS_CLUSTERS: 1 iff the kernel TU launches programmatic dependents / the
// target has thread block clusters (the templates set both for CUDA sm_90+; 0 otherwise).
#ifndef FC_ENABLE_PDL
#define FC_ENABLE_PDL 0
#endif
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
