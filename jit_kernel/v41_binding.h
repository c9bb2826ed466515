// flashcompress: tvm-ffi binding of the `v41` JIT family (host code; included only by the binding
// TU rendered from templates/v41_binding.cpp.j2). Python: python/flashcompress/cuda_ops/v41.py,
// after flashcompress/v41/validation.py has checked every argument (these checks only guard the
// kernels' memory assumptions: dtypes, shapes, contiguity, 16-byte alignment, one device).
//
// V41Binding<kOp, kLayout, kDesign, kDevice>::forward, one signature per op:
//   c1          (kv_input bf16 [N, 512], norm_weight bf16 [512], positions i32/i64 [N],
//                out_loc i32/i64 [N], eps, freqs fp32 [T, 64], k_cache u8 [pages, PB],
//                page_size, out bf16 [N, 512])
//   c2_decode   (kv_input f32 [N, 1024], kv_state f32 [R, 1024], norm_weight, positions,
//                req i64 [N], raw_out_loc i32/i64 [N], eps, freqs, k_cache, page_size,
//                ring_size, draft_len, out)
//   c2_prefill  (... as c2_decode up to page_size, ring_size, extend_start_loc i32 [B],
//                extend_seq_lens i32 [B], out)
//   index_k     (input bf16 [N, 128], norm_weight bf16 [128], eps, freqs, positions,
//                loc i64 [N], cache u8 [pages, 68 P], ratio)
// Launches on the caller's stream; N == 0 returns after the checks.
#pragma once

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cstdint>

#include "ffi_check.h"
#include "gpu_runtime.h"
#include "layout.h"
#include "v41_launch.h"

namespace flashcompress {
namespace v41_binding {

namespace chk = ::flashcompress::ffi_check;
using tvm::ffi::TensorView;

// The cache format of a layout's page (layout.h, the one C++ table of cache bytes); index-K
// (kNone) pages have the FP4 indexer's geometry: 64 payload + 4 scale bytes per slot, block-split.
constexpr StoreFormat store_format_of(V41Layout l) {
  switch (l) {
    case V41Layout::kV4: return StoreFormat::kV4;
    case V41Layout::kV41: return StoreFormat::kV41;
    case V41Layout::kV41Fp4: return StoreFormat::kV41Fp4;
    case V41Layout::kUniformFp8: return StoreFormat::kUniformFp8;
    case V41Layout::kV41New: return StoreFormat::kV41New;
    case V41Layout::kV41Fp4New: return StoreFormat::kV41Fp4New;
    default: return StoreFormat::kIndexFp4;
  }
}

// Page geometry of `layout` at `page_size` slots (layouts.py KVLayout.row_addressing).
inline V41Paging paging_of(V41Layout layout, int64_t page_size, int32_t shift) {
  const CacheFormatBytes f = cache_format(store_format_of(layout));
  V41Paging p{};
  p.page_bytes = cache_page_bytes(store_format_of(layout), page_size);
  p.page_shift = shift;
  if (f.interleaved) {
    p.data_stride = f.data_bytes + f.scale_bytes, p.scale_base = f.data_bytes, p.scale_stride = p.data_stride;
  } else {
    p.data_stride = f.data_bytes, p.scale_base = page_size * f.data_bytes, p.scale_stride = f.scale_bytes;
  }
  return p;
}

inline bool index_dtype(const TensorView& t, const char* name, int64_t rows, DLDevice dev) {
  const bool i64 = chk::same_dtype(t.dtype(), chk::kInt64);
  chk::check_tensor(t, name, i64 ? chk::kInt64 : chk::kInt32, {rows}, dev);
  return i64;
}

template <V41Op kOp, V41Layout kLayout, V41Design kDesign, DLDeviceType kDevice>
struct V41Binding {
  using Launch = V41Launch<kOp, kLayout, kDesign>;

  static void common(V41Args& a, const TensorView& input, const TensorView& weight, int64_t width, double eps,
                     const TensorView& freqs, const TensorView& positions, DLDevice dev, int64_t dim) {
    chk::check_aligned(input, "input", 16);
    a.rows = input.size(0);
    (void)width;
    chk::check_tensor(weight, "norm_weight", chk::kBFloat16, {dim}, dev);
    chk::check_aligned(weight, "norm_weight", 16);
    chk::check_tensor(freqs, "freqs_cis", chk::kFloat32, {chk::kAnySize, 64}, dev);
    chk::check_aligned(freqs, "freqs_cis", 16);
    a.positions_i64 = index_dtype(positions, "positions", a.rows, dev);
    a.input = input.data_ptr();
    a.norm_weight = static_cast<const uint16_t*>(weight.data_ptr());
    a.freq = static_cast<const float*>(freqs.data_ptr());
    a.positions = positions.data_ptr();
    a.eps = static_cast<float>(eps);
  }

  static void cache_args(V41Args& a, const TensorView& cache, int64_t page_size, DLDevice dev) {
    const int32_t shift = chk::check_page_size(page_size);
    a.paging = paging_of(kLayout, page_size, shift);
    chk::check_tensor(cache, "k_cache", chk::kUInt8, {chk::kAnySize, a.paging.page_bytes}, dev);
    chk::check_aligned(cache, "k_cache", 16);
    a.paging.cache = static_cast<uint8_t*>(cache.data_ptr());
  }

  static void out_arg(V41Args& a, const TensorView& out, DLDevice dev) {
    chk::check_tensor(out, "out", chk::kBFloat16, {a.rows, 512}, dev);
    chk::check_aligned(out, "out", 16);
    a.out = static_cast<uint16_t*>(out.data_ptr());
  }

  static void c1(TensorView kv_input, TensorView norm_weight, TensorView positions, TensorView out_loc, double eps,
                 TensorView freqs, TensorView k_cache, int64_t page_size, TensorView out) {
    chk::check_device_type(kv_input, "kv_input", kDevice);
    const DLDevice dev = kv_input.device();
    chk::check_tensor(kv_input, "kv_input", chk::kBFloat16, {chk::kAnySize, 512}, dev);
    V41Args a{};
    common(a, kv_input, norm_weight, 512, eps, freqs, positions, dev, 512);
    a.loc_i64 = index_dtype(out_loc, "out_loc", a.rows, dev);
    a.loc = out_loc.data_ptr();
    cache_args(a, k_cache, page_size, dev);
    out_arg(a, out, dev);
    if (a.rows == 0) return;
    chk::launch_on(dev, &Launch::run, a);
  }

  static void c2_args(V41Args& a, const TensorView& kv_input, const TensorView& kv_state, const TensorView& weight,
                      const TensorView& positions, const TensorView& req, const TensorView& raw_out_loc, double eps,
                      const TensorView& freqs, const TensorView& k_cache, int64_t page_size, int64_t ring_size,
                      DLDevice dev) {
    chk::check_tensor(kv_input, "kv_input", chk::kFloat32, {chk::kAnySize, 1024}, dev);
    common(a, kv_input, weight, 1024, eps, freqs, positions, dev, 512);
    chk::check_tensor(kv_state, "kv_state", chk::kFloat32, {chk::kAnySize, 1024}, dev);
    chk::check_aligned(kv_state, "kv_state", 16);
    chk::check_tensor(req, "req", chk::kInt64, {a.rows}, dev);
    a.loc_i64 = index_dtype(raw_out_loc, "raw_out_loc", a.rows, dev);
    chk::check_range(ring_size, "ring_size", 1, int64_t{1} << 30);
    a.state = static_cast<float*>(kv_state.data_ptr());
    a.req = static_cast<const int64_t*>(req.data_ptr());
    a.loc = raw_out_loc.data_ptr();
    a.ring_size = ring_size;
    cache_args(a, k_cache, page_size, dev);
  }

  static void c2_decode(TensorView kv_input, TensorView kv_state, TensorView norm_weight, TensorView positions,
                        TensorView req, TensorView raw_out_loc, double eps, TensorView freqs, TensorView k_cache,
                        int64_t page_size, int64_t ring_size, int64_t draft_len, TensorView out) {
    chk::check_device_type(kv_input, "kv_input", kDevice);
    const DLDevice dev = kv_input.device();
    V41Args a{};
    c2_args(a, kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps, freqs, k_cache, page_size,
            ring_size, dev);
    chk::check_range(draft_len, "draft_len", 1, ring_size > 1 ? ring_size - 1 : 1);
    a.draft_len = draft_len;
    out_arg(a, out, dev);
    if (a.rows == 0) return;
    chk::launch_on(dev, &Launch::run, a);
  }

  static void c2_prefill(TensorView kv_input, TensorView kv_state, TensorView norm_weight, TensorView positions,
                         TensorView req, TensorView raw_out_loc, double eps, TensorView freqs, TensorView k_cache,
                         int64_t page_size, int64_t ring_size, TensorView extend_start_loc,
                         TensorView extend_seq_lens, TensorView out) {
    chk::check_device_type(kv_input, "kv_input", kDevice);
    const DLDevice dev = kv_input.device();
    V41Args a{};
    c2_args(a, kv_input, kv_state, norm_weight, positions, req, raw_out_loc, eps, freqs, k_cache, page_size,
            ring_size, dev);
    chk::check_tensor(extend_start_loc, "extend_start_loc", chk::kInt32, {chk::kAnySize}, dev);
    a.batch = extend_start_loc.size(0);
    chk::check_tensor(extend_seq_lens, "extend_seq_lens", chk::kInt32, {a.batch}, dev);
    a.extend_start = static_cast<const int32_t*>(extend_start_loc.data_ptr());
    a.extend_len = static_cast<const int32_t*>(extend_seq_lens.data_ptr());
    a.draft_len = 1;
    out_arg(a, out, dev);
    if (a.rows == 0) return;
    chk::launch_on(dev, &Launch::run, a);
  }

  static void index_k(TensorView input, TensorView norm_weight, double eps, TensorView freqs, TensorView positions,
                      TensorView loc, TensorView cache, int64_t ratio) {
    chk::check_device_type(input, "input", kDevice);
    const DLDevice dev = input.device();
    chk::check_tensor(input, "input", chk::kBFloat16, {chk::kAnySize, 128}, dev);
    V41Args a{};
    common(a, input, norm_weight, 128, eps, freqs, positions, dev, 128);
    chk::check_tensor(loc, "loc", chk::kInt64, {a.rows}, dev);
    a.loc = loc.data_ptr();
    a.loc_i64 = true;
    TVM_FFI_CHECK(ratio == 1 || ratio == 2, ValueError) << "ratio: expected 1 or 2, got " << ratio;
    a.ratio = static_cast<int32_t>(ratio);
    chk::check_ndim(cache, "cache", 2);
    const int64_t page_size = cache.size(1) / 68;
    TVM_FFI_CHECK(page_size > 0 && cache.size(1) == 68 * page_size, ValueError)
        << "cache: expected [pages, 68 * P], got " << cache.size(1) << " bytes per page";
    const int32_t shift = chk::check_page_size(page_size);
    a.paging = paging_of(V41Layout::kNone, page_size, shift);
    chk::check_tensor(cache, "cache", chk::kUInt8, {chk::kAnySize, a.paging.page_bytes}, dev);
    chk::check_aligned(cache, "cache", 16);
    a.paging.cache = static_cast<uint8_t*>(cache.data_ptr());
    if (a.rows == 0) return;
    chk::launch_on(dev, &Launch::run, a);
  }
};

}  // namespace v41_binding
}  // namespace flashcompress
