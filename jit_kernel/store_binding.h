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
//     freq     complex64 [T, 32] or its fp32 view [T, 64], contiguous, 16-byte aligned
//     out_loc  int64 [M], contiguous; decode: M == N, prefill: M >= N
//     kvcache  uint8 [pages, page_bytes(page_size)], contiguous, 16-byte aligned
//     page_size a power of two in [1, 2^30]; is_decode bool; ratio a power of two in [1, 2^30]
//     Launches on the caller's stream (TVMFFIEnvGetStream); N = 0 returns after the checks.
//     kvcache shares no byte with kv, weight, freq or out_loc; eps lies in (0, 1).
//     Values are not read here (out_loc inside the cache, positions inside the table: the API
//     layer checks those with FLASHCOMPRESS_DEBUG=1).
//   forward_checked(same arguments)   forward with freq only complex64 [T, 32] (the API's type):
//     the API's eager path (flashcompress.fastpath) calls it with the caller's tensors.
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
#include "layout.h"
#include "store_args.h"
#include "store_launch.h"

namespace flashcompress {
namespace store_binding {

namespace chk = ::flashcompress::ffi_check;
using tvm::ffi::TensorView;

inline constexpr int64_t kMaxRatio = int64_t{1} << 30;

template <int kHeadDim, StoreFormat kFmt, RowDtype kIn, DLDeviceType kDevice>
struct StoreBinding {
  static_assert(cache_format(kFmt).head_dim == kHeadDim, "format / head dim mismatch");
  using Launch = StoreLaunch<kHeadDim, kFmt, kIn>;
  static constexpr DLDataType kRowType = kIn == RowDtype::kF32 ? chk::kFloat32 : chk::kBFloat16;
  static constexpr uint64_t kRowAlign = kIn == RowDtype::kF32 ? 16 : 8;

  static void forward(TensorView kv, TensorView plan, TensorView weight, double eps, TensorView freq,
                      TensorView out_loc, TensorView kvcache, int64_t page_size, bool is_decode,
                      int64_t ratio) {
    run(kv, plan, weight, eps, freq, out_loc, kvcache, page_size, is_decode, ratio, false);
  }

  // forward with freq_cis only as the API takes it (complex64 [T, 32]): the API's eager path.
  static void forward_checked(TensorView kv, TensorView plan, TensorView weight, double eps, TensorView freq,
                              TensorView out_loc, TensorView kvcache, int64_t page_size, bool is_decode,
                              int64_t ratio) {
    run(kv, plan, weight, eps, freq, out_loc, kvcache, page_size, is_decode, ratio, true);
  }

  static void run(const TensorView& kv, const TensorView& plan, const TensorView& weight, double eps,
                  const TensorView& freq, const TensorView& out_loc, const TensorView& kvcache,
                  int64_t page_size, bool is_decode, int64_t ratio, bool complex_freq) {
    chk::check_device_type(kv, "kv", kDevice);
    const DLDevice dev = kv.device();
    chk::check_tensor(kv, "kv", kRowType, {chk::kAnySize, kHeadDim}, dev);
    chk::check_aligned(kv, "kv", kRowAlign);
    const int64_t rows = kv.size(0);
    chk::check_tensor(plan, "plan", chk::kUInt8, {rows, kCompressPlanBytes}, dev);
    chk::check_aligned(plan, "plan", kCompressPlanBytes);
    chk::check_tensor(weight, "norm_weight", kRowType, {kHeadDim}, dev);
    chk::check_aligned(weight, "norm_weight", kRowAlign);
    chk::check_norm_eps(eps);
    const int64_t freq_rows = chk::check_freq(freq, dev, complex_freq);
    chk::check_out_loc(out_loc, rows, is_decode, dev);
    const int32_t page_shift = chk::check_page_size(page_size);
    const int64_t page_bytes = cache_page_bytes(kFmt, page_size);
    chk::check_tensor(kvcache, "kvcache", chk::kUInt8, {chk::kAnySize, page_bytes}, dev);
    chk::check_aligned(kvcache, "kvcache", 16);
    chk::check_power_of_two(ratio, "ratio", kMaxRatio);
    // the cache is written while everything else is read
    chk::check_no_overlap(kvcache, "kvcache", kv, "kv");
    chk::check_no_overlap(kvcache, "kvcache", weight, "norm_weight");
    chk::check_no_overlap(kvcache, "kvcache", freq, "freq_cis");
    chk::check_no_overlap(kvcache, "kvcache", out_loc, "out_loc");
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
    args.store.freq_rows = freq_rows;
    args.store.cache = static_cast<uint8_t*>(kvcache.data_ptr());
    args.store.page_bytes = page_bytes;
    args.store.page_shift = page_shift;
    args.store.norm_eps = static_cast<float>(eps);
    chk::launch_on(dev, &Launch::run, args);
  }

  static int64_t page_bytes(int64_t page_size) {
    chk::check_range(page_size, "page_size", 1, chk::kMaxPageSize);
    return cache_page_bytes(kFmt, page_size);
  }

  static tvm::ffi::String format_info() {
    const CacheFormatBytes f = cache_format(kFmt);
    std::ostringstream os;
    os << "{\"name\": \"" << f.name << "\", \"head_dim\": " << f.head_dim << ", \"data_bytes\": " << f.data_bytes
       << ", \"scale_bytes\": " << f.scale_bytes << ", \"page_align\": " << f.page_align
       << ", \"row_dtype\": \"" << (kIn == RowDtype::kF32 ? "f32" : "bf16") << "\"}";
    return tvm::ffi::String(os.str());
  }
};

}  // namespace store_binding
}  // namespace flashcompress
