// flashcompress: the one kernel launch path of every family (host code of kernel TUs).
//
//   launch_kernel(kernel, LaunchConfig{grid, block, smem, cluster, pdl}, stream, args...)
//     grid x block threads with `smem` bytes of dynamic shared memory; on CUDA `cluster` blocks
//     per thread block cluster (> 1) and, with `pdl`, as a programmatic dependent of the stream's
//     previous kernel (the kernel must pdl_wait before its first global-memory access). HIP has
//     neither: cluster must be 1 and pdl is ignored. A zero grid launches nothing.
//   KernelOccupancy<kernel> ::resident(block, cluster)
//     blocks of `kernel` the current device runs at once (whole clusters), queried once per
//     device and cached; a negative value is the negated runtime error.
#pragma once

#include <atomic>
#include <cstdint>

#include "gpu_runtime.h"

namespace flashcompress {

// FC_ENABLE_PDL as a constant: the TU launches its kernels as programmatic dependents.
inline constexpr bool kPdlLaunch = FC_ENABLE_PDL != 0;

struct LaunchConfig {
  unsigned grid = 0;     // blocks (x)
  unsigned block = 0;    // threads per block (x)
  unsigned smem = 0;     // dynamic shared memory, bytes
  unsigned cluster = 1;  // blocks per thread block cluster (1: none)
  bool pdl = false;      // programmatic dependent of the stream's previous kernel
};

template <class... Params, class... Args>
inline gpuError_t launch_kernel(void (*kernel)(Params...), const LaunchConfig& c, gpuStream_t stream,
                                const Args&... args) {
  if (c.grid == 0) return gpuSuccess;
#if FC_GPU_HIP
  hipLaunchKernelGGL(kernel, dim3(c.grid), dim3(c.block), c.smem, stream, args...);
  return hipGetLastError();
#else
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(c.grid);
  cfg.blockDim = dim3(c.block);
  cfg.dynamicSmemBytes = c.smem;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  unsigned n = 0;
  if (c.cluster > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = c.cluster;
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  if (c.pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
#endif
}

namespace detail {

// Resident blocks of `kernel` on device `dev` (>= 1 when the query fails). A cluster kernel counts
// whole clusters: a cluster must fit in one GPC, so fewer blocks than SMs x blocks per SM may be
// resident, and a grid sized from the per-SM figure would run one cluster in a second wave.
template <class Fn>
int64_t query_resident(Fn kernel, unsigned block, unsigned cluster, int dev) {
  int sms = 0, per_sm = 0;
#if FC_GPU_HIP
  (void)cluster;
  if (hipDeviceGetAttribute(&sms, hipDeviceAttributeMultiprocessorCount, dev) != hipSuccess ||
      hipOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, static_cast<int>(block), 0) != hipSuccess) {
    (void)hipGetLastError();
    return 1;
  }
#else
  if (cluster > 1) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(cluster);
    cfg.blockDim = dim3(block);
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = cluster;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess || clusters <= 0) {
      (void)cudaGetLastError();
      return cluster;
    }
    return static_cast<int64_t>(clusters) * cluster;
  }
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, static_cast<int>(block), 0) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
#endif
  return static_cast<int64_t>(sms) * (per_sm > 0 ? per_sm : 1);
}

}  // namespace detail

template <auto kKernel>
struct KernelOccupancy {
  static constexpr int kMaxDevices = 64;
  static inline std::atomic<int64_t> cache[kMaxDevices] = {};  // 0: not yet queried

  static int64_t resident(unsigned block, unsigned cluster) {
    int dev = 0;
    const gpuError_t e = gpuGetDevice(&dev);
    if (e != gpuSuccess) return -static_cast<int64_t>(e);
    const bool cached = dev >= 0 && dev < kMaxDevices;
    if (cached) {
      const int64_t r = cache[dev].load(std::memory_order_relaxed);
      if (r > 0) return r;
    }
    const int64_t r = detail::query_resident(kKernel, block, cluster, dev);
    if (cached && r > 0) cache[dev].store(r, std::memory_order_relaxed);
    return r;
  }
};

}  // namespace flashcompress
