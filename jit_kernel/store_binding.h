// flashcompress: tvm-ffi binding of the `store` JIT family (host code, compiled by the host
// compiler; included only by the binding TU rendered from templates/store_binding.cpp.j2).
//
// StoreBinding<kHeadDim, kFmt, kIn, kDevice> holds the exports of one variant. The launcher
// StoreLaunch<kHeadDim, kFmt, kIn> (store_launch.h) is explicitly instantiated in the kernel TU.
// Python: python/flashcompress/cuda_ops/store.py.
//
// Exports:
//   forward(kv, plan, weight, eps, freq, out_loc, kvcache, page_size, is_decode, ratio)
//     kv       [N, H] dtype kIn (fp32 | bf16), contiguous, 16-byte (fp32) / 8-byte (bf16) aligned
//     plan     uint8 [N, 16], contiguous, 16-byte aligned (DecodePlan | CompressPlan rows)
//     weight   [H] dtype kIn, contiguous, aligned like kv (the caller casts it to kv's dtype)
//     eps      float (crosses as fp32)
//     freq     fp32 [T, 64], contiguous, 16-byte aligned (view_as_real of the complex table)
//     out_loc  int64 [M], contiguous; decode: M == N, prefill: M >= N
//     kvcache  uint8 [pages, page_bytes(page_size)], contiguous, 16-byte aligned
//     page_size a power of two in [1, 2^30]; is_decode bool; ratio a power of two in [1, 2^30]
//     Launches on the caller's stream (TVMFFIEnvGetStream); N = 0 returns after the checks.
//     Values are not read here (out_loc inside the cache, positions inside the table: the API
//     layer checks those with FLASHCOMPRESS_DEBUG=1).
//   quant_probe(x fp32 [n], out uint8 [n, 4])   n % 4 == 0; the device encoders (test probe)
//   page_bytes(page_size) -> int                bytes per page of this format (host only)
//   format_info() -> str                        JSON: head_dim, data_bytes, scale_bytes, ...
//
// Wrong dtypes raise TypeError, everything else ValueError, naming the argument (ffi_check.h).
#pragma once

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/string.h>

#include <cstdint>
#include <sstream>
#include <string>

#include "ffi_check.h"
#include "gpu_runtime.h"
#include "plan.cuh"
#include "store_args.h"
#include "store_launch.h"

namespace flashcompress {
namespace store_binding {

namespace chk = ::flashcompress::ffi_check;
using tvm::ffi::TensorView;

inline constexpr int64_t kMaxPageSize = int64_t{1} << 30;
inline constexpr int64_t kMaxRatio = int64_t{1} << 30;

// Data / scale bytes per token and the page alignment (mirror of layouts.CacheFormat).
struct FormatBytes {
  const char* name;
  int64_t head_dim, data_bytes, scale_bytes, page_align;
};

constexpr FormatBytes format_bytes(StoreFormat fmt) {
  switch (fmt) {
    case StoreFormat::kV4: return {"v4", 512, 576, 8, 576};
    case StoreFormat::kIndexFp8: return {"idx_fp8", 128, 128, 4, 1};
    case StoreFormat::kIndexFp4: return {"idx_fp4", 128, 64, 4, 1};
    case StoreFormat::kBf16: return {"bf16", 512, 1024, 0, 1};
    default: return {"none", 0, 0, 0, 1};
  }
}

constexpr int64_t page_bytes_of(StoreFormat fmt, int64_t page_size) {
  const FormatBytes f = format_bytes(fmt);
  const int64_t raw = page_size * (f.data_bytes + f.scale_bytes);
  return (raw + f.page_align - 1) / f.page_align * f.page_align;
}

static_assert(page_bytes_of(StoreFormat::kV4, 64) == 37440 && page_bytes_of(StoreFormat::kV4, 2) == 1728 &&
                  page_bytes_of(StoreFormat::kV4, 1) == 1152,
              "V4 pages: ceil(584 P / 576) * 576 (spec §5.1)");
static_assert(page_bytes_of(StoreFormat::kIndexFp8, 64) == 8448 &&
                  page_bytes_of(StoreFormat::kIndexFp4, 64) == 4352,
              "indexer pages: 132 P and 68 P (spec §6.4)");

inline int32_t log2_exact(int64_t v) {
  int32_t s = 0;
  while ((int64_t{1} << s) < v) ++s;
  return s;
}

inline gpuStream_t stream_of(DLDevice device) {
  return static_cast<gpuStream_t>(TVMFFIEnvGetStream(device.device_type, device.device_id));
}

template <int kHeadDim, StoreFormat kFmt, RowDtype kIn, DLDeviceType kDevice>
struct StoreBinding {
  static_assert(format_bytes(kFmt).head_dim == kHeadDim, "format / head dim mismatch");
  using Launch = StoreLaunch<kHeadDim, kFmt, kIn>;
  static constexpr DLDataType kRowType = kIn == RowDtype::kF32 ? chk::kFloat32 : chk::kBFloat16;
  static constexpr uint64_t kRowAlign = kIn == RowDtype::kF32 ? 16 : 8;

  static void forward(TensorView kv, TensorView plan, TensorView weight, double eps, TensorView freq,
                      TensorView out_loc, TensorView kvcache, int64_t page_size, bool is_decode,
                      int64_t ratio) {
    chk::check_device_type(kv, "kv", kDevice);
    const DLDevice dev = kv.device();
    chk::check_tensor(kv, "kv", kRowType, {chk::kAnySize, kHeadDim}, dev);
    chk::check_aligned(kv, "kv", kRowAlign);
    const int64_t rows = kv.size(0);
    chk::check_tensor(plan, "plan", chk::kUInt8, {rows, kCompressPlanBytes}, dev);
    chk::check_aligned(plan, "plan", kCompressPlanBytes);
    chk::check_tensor(weight, "norm_weight", kRowType, {kHeadDim}, dev);
    chk::check_aligned(weight, "norm_weight", kRowAlign);
    chk::check_tensor(freq, "freq", chk::kFloat32, {chk::kAnySize, 64}, dev);
    chk::check_aligned(freq, "freq", 16);
    chk::check_dtype(out_loc, "out_loc", chk::kInt64);
    chk::check_ndim(out_loc, "out_loc", 1);
    chk::check_contiguous(out_loc, "out_loc");
    chk::check_same_device(out_loc, "out_loc", dev);
    if (is_decode) {
      TVM_FFI_CHECK(out_loc.size(0) == rows, ValueError)
          << "out_loc: expected " << rows << " entries (one per decode row), got " << out_loc.size(0);
    } else {
      TVM_FFI_CHECK(out_loc.size(0) >= rows, ValueError)
          << "out_loc: expected >= " << rows << " entries (one per query token), got " << out_loc.size(0);
    }
    chk::check_range(page_size, "page_size", 1, kMaxPageSize);
    TVM_FFI_CHECK((page_size & (page_size - 1)) == 0, ValueError)
        << "page_size: expected a power of two, got " << page_size;
    const int64_t page_bytes = page_bytes_of(kFmt, page_size);
    chk::check_tensor(kvcache, "kvcache", chk::kUInt8, {chk::kAnySize, page_bytes}, dev);
    chk::check_aligned(kvcache, "kvcache", 16);
    chk::check_range(ratio, "ratio", 1, kMaxRatio);
    TVM_FFI_CHECK((ratio & (ratio - 1)) == 0, ValueError) << "ratio: expected a power of two, got " << ratio;
    if (rows == 0) return;

    StoreKernelArgs args{};
    args.kv = kv.data_ptr();
    args.plan = static_cast<const uint8_t*>(plan.data_ptr());
    args.out_loc = static_cast<const int64_t*>(out_loc.data_ptr());
    args.rows = rows;
    args.ratio = static_cast<uint32_t>(ratio);
    args.is_decode = is_decode;
    if constexpr (kIn == RowDtype::kF32) {
      args.store.norm_weight = static_cast<const float*>(weight.data_ptr());
      args.store.norm_weight_bf16 = nullptr;
    } else {
      args.store.norm_weight = nullptr;
      args.store.norm_weight_bf16 = static_cast<const uint16_t*>(weight.data_ptr());
    }
    args.store.freq = static_cast<const float*>(freq.data_ptr());
    args.store.freq_rows = freq.size(0);
    args.store.cache = static_cast<uint8_t*>(kvcache.data_ptr());
    args.store.page_bytes = page_bytes;
    args.store.page_shift = log2_exact(page_size);
    args.store.norm_eps = static_cast<float>(eps);
    chk::GpuDeviceGuard guard(dev.device_id);
    FC_CHECK_GPU_ERROR(Launch::run(args, stream_of(dev)));
  }

  static void quant_probe(TensorView x, TensorView out) {
    chk::check_device_type(x, "x", kDevice);
    const DLDevice dev = x.device();
    chk::check_tensor(x, "x", chk::kFloat32, {chk::kAnySize}, dev);
    const int64_t n = x.size(0);
    TVM_FFI_CHECK(n % 4 == 0, ValueError) << "x: expected a multiple of 4 values, got " << n;
    chk::check_tensor(out, "out", chk::kUInt8, {n, 4}, dev);
    if (n == 0) return;
    chk::GpuDeviceGuard guard(dev.device_id);
    FC_CHECK_GPU_ERROR(Launch::quant_probe(static_cast<const float*>(x.data_ptr()),
                                           static_cast<uint8_t*>(out.data_ptr()), n, stream_of(dev)));
  }

  static int64_t page_bytes(int64_t page_size) {
    chk::check_range(page_size, "page_size", 1, kMaxPageSize);
    return page_bytes_of(kFmt, page_size);
  }

  static tvm::ffi::String format_info() {
    const FormatBytes f = format_bytes(kFmt);
    std::ostringstream os;
    os << "{\"name\": \"" << f.name << "\", \"head_dim\": " << f.head_dim << ", \"data_bytes\": " << f.data_bytes
       << ", \"scale_bytes\": " << f.scale_bytes << ", \"page_align\": " << f.page_align
       << ", \"row_dtype\": \"" << (kIn == RowDtype::kF32 ? "f32" : "bf16") << "\"}";
    return tvm::ffi::String(os.str());
  }
};

}  // namespace store_binding
}  // namespace flashcompress
