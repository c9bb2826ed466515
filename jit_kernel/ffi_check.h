// flashcompress: argument checks for tvm-ffi binding TUs (host code, compiled by the host
// compiler; never include this from a .cu file: the tvm-ffi headers are slow under nvcc).
//
// Each check raises a Python exception through TVM_FFI_CHECK with a message that names the
// argument, the expectation and the actual value, e.g.
//   TypeError:  plan_c: expected dtype uint8, got int32
//   ValueError: seq_lens: expected shape [3], got [4]
//   ValueError: req_pool_indices: expected device cuda:0, got cpu:0
// Wrong dtypes raise TypeError; everything else (shape, device, layout, alignment, ranges)
// raises ValueError.
//
// The checks of the paged-cache arguments both store bindings take (store, compress_store):
//   check_page_size(page_size) -> log2(page_size)   a power of two in [1, 2^30]
//   check_out_loc(out_loc, rows, is_decode, dev)     int64 [M]; decode M == rows, prefill M >= rows
//   check_freq(freq, dev, complex_only)              the RoPE table; returns its rows
//   check_norm_eps(eps)                              in (0, 1)
// and the aliasing rule of the API (a buffer a launch writes shares no byte with one it reads):
//   check_no_overlap(written, name, read, name)      both contiguous (checked before)
//
// It also holds the binding side of the GPU runtime shim (gpu_runtime.h), for launches:
//   FC_CHECK_GPU_ERROR(stmt)   RuntimeError "<CUDA|HIP> Runtime Error: <name> (<code>): <text>"
//                              unless stmt returns gpuSuccess
//   GpuDeviceGuard guard(id)   makes device id current for the scope, restores the previous one
//   launch_on(dev, launcher, args)   launcher(args, the caller's stream of dev) with dev current
// On CUDA these are tvm-ffi's TVM_FFI_CHECK_CUDA_ERROR and tvm::ffi::CUDADeviceGuard
// themselves; on HIP (tvm-ffi has no HIP counterparts) they are the same code over the HIP
// runtime.
//
// Host-only modules (compiled with -DFC_HOST_ONLY=1, jit/flags.py) get the tensor checks
// alone: no GPU runtime header is included, so they build without any GPU toolkit.
#pragma once

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/dtype.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#ifndef FC_HOST_ONLY
#define FC_HOST_ONLY 0
#endif

#if !FC_HOST_ONLY
#include "gpu_runtime.h"
#if !FC_GPU_HIP
#include <tvm/ffi/extra/cuda/base.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#endif
#endif  // !FC_HOST_ONLY

#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>

namespace flashcompress {
namespace ffi_check {

using tvm::ffi::TensorView;

inline constexpr DLDataType kInt32{kDLInt, 32, 1};
inline constexpr DLDataType kInt64{kDLInt, 64, 1};
inline constexpr DLDataType kUInt8{kDLUInt, 8, 1};
inline constexpr DLDataType kFloat32{kDLFloat, 32, 1};
inline constexpr DLDataType kBFloat16{kDLBfloat, 16, 1};

// Matches any size in check_shape.
inline constexpr int64_t kAnySize = -1;

inline bool same_dtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

// Never throws: it builds the messages of failing checks, where a second exception would
// terminate the process (tvm-ffi's own dtype names have no complex type and throw on it).
inline std::string dtype_name(DLDataType t) {
  if (t.code == kDLComplex) {
    std::string name = "complex" + std::to_string(t.bits);
    return t.lanes == 1 ? name : name + "x" + std::to_string(t.lanes);
  }
  try {
    return std::string(tvm::ffi::DLDataTypeToString(t).c_str());
  } catch (...) {
    return "type_code " + std::to_string(t.code) + " bits " + std::to_string(t.bits);
  }
}

inline std::string device_type_name(int32_t device_type) {
  switch (device_type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda";
    case kDLCUDAHost: return "cuda_host";
    case kDLCUDAManaged: return "cuda_managed";
    case kDLROCM: return "rocm";
    case kDLROCMHost: return "rocm_host";
    default: return "device_type_" + std::to_string(device_type);
  }
}

inline std::string device_name(DLDevice d) {
  return device_type_name(static_cast<int32_t>(d.device_type)) + ":" + std::to_string(d.device_id);
}

inline std::string shape_string(const TensorView& t) {
  std::ostringstream os;
  os << "[";
  for (int32_t i = 0; i < t.ndim(); ++i) os << (i ? ", " : "") << t.size(i);
  os << "]";
  return os.str();
}

inline std::string shape_string(std::initializer_list<int64_t> dims) {
  std::ostringstream os;
  os << "[";
  int i = 0;
  for (int64_t d : dims) {
    os << (i++ ? ", " : "");
    if (d == kAnySize) {
      os << "*";
    } else {
      os << d;
    }
  }
  os << "]";
  return os.str();
}

inline void check_dtype(const TensorView& t, const char* name, DLDataType expected) {
  TVM_FFI_CHECK(same_dtype(t.dtype(), expected), TypeError)
      << name << ": expected dtype " << dtype_name(expected) << ", got " << dtype_name(t.dtype());
}

inline void check_ndim(const TensorView& t, const char* name, int32_t ndim) {
  TVM_FFI_CHECK(t.ndim() == ndim, ValueError)
      << name << ": expected a " << ndim << "-D tensor, got " << t.ndim() << "-D with shape "
      << shape_string(t);
}

// Exact shape; kAnySize matches any extent.
inline void check_shape(const TensorView& t, const char* name,
                        std::initializer_list<int64_t> dims) {
  bool ok = t.ndim() == static_cast<int32_t>(dims.size());
  if (ok) {
    int32_t i = 0;
    for (int64_t d : dims) {
      if (d != kAnySize && t.size(i) != d) ok = false;
      ++i;
    }
  }
  TVM_FFI_CHECK(ok, ValueError) << name << ": expected shape " << shape_string(dims) << ", got "
                                << shape_string(t);
}

inline void check_contiguous(const TensorView& t, const char* name) {
  TVM_FFI_CHECK(t.IsContiguous(), ValueError)
      << name << ": expected a contiguous tensor (shape " << shape_string(t) << ")";
}

inline void check_device_type(const TensorView& t, const char* name, DLDeviceType type) {
  TVM_FFI_CHECK(t.device().device_type == type, ValueError)
      << name << ": expected a " << device_type_name(static_cast<int32_t>(type))
      << " tensor, got one on " << device_name(t.device());
}

inline void check_same_device(const TensorView& t, const char* name, DLDevice expected) {
  const DLDevice d = t.device();
  TVM_FFI_CHECK(d.device_type == expected.device_type && d.device_id == expected.device_id,
                ValueError)
      << name << ": expected device " << device_name(expected) << ", got " << device_name(d);
}

inline void check_aligned(const TensorView& t, const char* name, uint64_t bytes) {
  const uint64_t addr = reinterpret_cast<uint64_t>(t.data_ptr()) + t.byte_offset();
  TVM_FFI_CHECK(t.numel() == 0 || addr % bytes == 0, ValueError)
      << name << ": data must be " << bytes << "-byte aligned (address 0x" << std::hex << addr
      << std::dec << ")";
}

inline void check_range(int64_t value, const char* name, int64_t lo, int64_t hi) {
  TVM_FFI_CHECK(value >= lo && value <= hi, ValueError)
      << name << ": expected a value in [" << lo << ", " << hi << "], got " << value;
}

// Bytes a contiguous tensor covers: [address, address + numel * element bytes).
inline uint64_t byte_begin(const TensorView& t) {
  return reinterpret_cast<uint64_t>(t.data_ptr()) + t.byte_offset();
}
inline uint64_t byte_end(const TensorView& t) {
  const DLDataType d = t.dtype();
  return byte_begin(t) + static_cast<uint64_t>(t.numel()) * ((d.bits * d.lanes + 7) / 8);
}

// Two contiguous tensors share no byte (an empty tensor overlaps nothing): `written` is written
// by the launch while `read` is read (the API's aliasing rule, validation.check_no_overlap).
inline void check_no_overlap(const TensorView& written, const char* written_name, const TensorView& read,
                             const char* read_name) {
  const uint64_t a0 = byte_begin(written), a1 = byte_end(written);
  const uint64_t b0 = byte_begin(read), b1 = byte_end(read);
  TVM_FFI_CHECK(!(a0 < b1 && b0 < a1), ValueError)
      << read_name << ": expected memory separate from " << written_name << " (" << written_name
      << " is written while " << read_name << " is read)";
}

// norm_eps: a float in (0, 1) (NaN fails).
inline void check_norm_eps(double eps) {
  TVM_FFI_CHECK(eps > 0.0 && eps < 1.0, ValueError) << "norm_eps: expected a float in (0, 1), got " << eps;
}

// dtype + exact shape + contiguity + device in one call (the common case).
inline void check_tensor(const TensorView& t, const char* name, DLDataType dtype,
                         std::initializer_list<int64_t> dims, DLDevice device) {
  check_dtype(t, name, dtype);
  check_shape(t, name, dims);
  check_contiguous(t, name);
  check_same_device(t, name, device);
}

// ------------------------------------------------------------------------------------------
// Paged-cache arguments of the store bindings
// ------------------------------------------------------------------------------------------

inline constexpr int64_t kMaxPageSize = int64_t{1} << 30;

// A power of two in [1, hi].
inline void check_power_of_two(int64_t value, const char* name, int64_t hi) {
  check_range(value, name, 1, hi);
  TVM_FFI_CHECK((value & (value - 1)) == 0, ValueError) << name << ": expected a power of two, got " << value;
}

// Checks page_size and returns log2(page_size), the kernels' page_shift.
inline int32_t check_page_size(int64_t page_size) {
  check_power_of_two(page_size, "page_size", kMaxPageSize);
  int32_t shift = 0;
  while ((int64_t{1} << shift) < page_size) ++shift;
  return shift;
}

inline constexpr DLDataType kComplex64{kDLComplex, 64, 1};

// freq_cis: the RoPE table, complex64 [T, 32] or (unless complex_only, the API's own type) its fp32
// view [T, 64] (re, im pairs; the same bytes), contiguous, 16-byte aligned, on `device`.  Returns T,
// the table's rows.
inline int64_t check_freq(const TensorView& freq, DLDevice device, bool complex_only = false) {
  if (complex_only || same_dtype(freq.dtype(), kComplex64)) {
    check_tensor(freq, "freq_cis", kComplex64, {kAnySize, 32}, device);
  } else {
    check_tensor(freq, "freq_cis", kFloat32, {kAnySize, 64}, device);
  }
  check_aligned(freq, "freq_cis", 16);
  return freq.size(0);
}

// out_loc: int64 [M], contiguous, on `device`; decode: M == rows (one slot per request),
// prefill: M >= rows (indexed by the plan rows' ragged ids).
inline void check_out_loc(const TensorView& out_loc, int64_t rows, bool is_decode, DLDevice device) {
  check_dtype(out_loc, "out_loc", kInt64);
  check_ndim(out_loc, "out_loc", 1);
  check_contiguous(out_loc, "out_loc");
  check_same_device(out_loc, "out_loc", device);
  if (is_decode) {
    TVM_FFI_CHECK(out_loc.size(0) == rows, ValueError)
        << "out_loc: expected " << rows << " entries (one per decode request), got " << out_loc.size(0);
  } else {
    TVM_FFI_CHECK(out_loc.size(0) >= rows, ValueError)
        << "out_loc: expected >= " << rows << " entries (one per query token), got " << out_loc.size(0);
  }
}

// ------------------------------------------------------------------------------------------
// GPU runtime errors and the current device
// ------------------------------------------------------------------------------------------

#if !FC_HOST_ONLY  // host-only modules have no GPU runtime
#if FC_GPU_HIP
#define FC_CHECK_GPU_ERROR(stmt)                                                           \
  do {                                                                                     \
    const ::flashcompress::gpuError_t fc_gpu_err_ = (stmt);                                \
    if (fc_gpu_err_ != ::flashcompress::gpuSuccess) {                                      \
      TVM_FFI_THROW(RuntimeError) << FC_GPU_RUNTIME_NAME " Runtime Error: "                \
                                  << ::flashcompress::gpuGetErrorName(fc_gpu_err_) << " (" \
                                  << static_cast<int>(fc_gpu_err_) << "): "                \
                                  << ::flashcompress::gpuGetErrorString(fc_gpu_err_);      \
    }                                                                                      \
  } while (0)

// tvm::ffi::CUDADeviceGuard over the HIP runtime.
class GpuDeviceGuard {
 public:
  GpuDeviceGuard() = delete;
  GpuDeviceGuard(const GpuDeviceGuard&) = delete;
  GpuDeviceGuard& operator=(const GpuDeviceGuard&) = delete;
  explicit GpuDeviceGuard(int device_index) : target_device_index_(device_index) {
    FC_CHECK_GPU_ERROR(gpuGetDevice(&original_device_index_));
    if (target_device_index_ != original_device_index_) {
      FC_CHECK_GPU_ERROR(gpuSetDevice(target_device_index_));
    }
  }
  ~GpuDeviceGuard() noexcept(false) {
    if (original_device_index_ != target_device_index_) {
      FC_CHECK_GPU_ERROR(gpuSetDevice(original_device_index_));
    }
  }

 private:
  int original_device_index_ = 0;
  int target_device_index_;
};
#else
#define FC_CHECK_GPU_ERROR(stmt) TVM_FFI_CHECK_CUDA_ERROR(stmt)
using GpuDeviceGuard = ::tvm::ffi::CUDADeviceGuard;
#endif  // FC_GPU_HIP

// The DLPack device type of this build's GPU runtime: every tensor a kernel reads lives there.
inline constexpr DLDeviceType kGpuDeviceType = FC_GPU_HIP ? kDLROCM : kDLCUDA;

// The caller's current stream on `device` (torch's, through tvm-ffi's environment).
inline gpuStream_t stream_of(DLDevice device) {
  return static_cast<gpuStream_t>(TVMFFIEnvGetStream(device.device_type, device.device_id));
}

// launcher(args, stream_of(device)) with `device` current; a launch error raises RuntimeError.
template <typename Args>
void launch_on(DLDevice device, gpuError_t (*launcher)(const Args&, gpuStream_t), const Args& args) {
  GpuDeviceGuard guard(device.device_id);
  FC_CHECK_GPU_ERROR(launcher(args, stream_of(device)));
}
#endif  // !FC_HOST_ONLY

}  // namespace ffi_check
}  // namespace flashcompress
