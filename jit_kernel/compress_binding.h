// flashcompress: tvm-ffi binding of the `compress` family (host code, compiled by the host
// compiler; included only by the binding TU rendered from templates/compress_binding.cpp.j2).
//
// CompressBinding<Launch, kRatio, kOnline, kHeadDim, kIn, kState, kOut, kFmt> holds the export of
// one variant; Launch is CompressLaunch<...> (compress_launch.h), defined in the kernel TU.
//
//   compress(state, input, ape, plan, plan_w, out, is_decode)          kFmt == kNone variants
//   compress_store(state, input, ape, plan, plan_w, norm_weight, freq, out_loc,
//                  kvcache, norm_eps, page_size, is_decode)            store variants
//   compress_decode(state, input, ape, plan, out)                      kNone, decode plan
//   compress_decode_alloc(state, input, ape, plan) -> out               the same into rows it
//                                    allocates through the caller's allocator (TVMFFIEnvTensorAlloc)
//   compress_store_decode(state, input, ape, plan, norm_weight, freq, out_loc, kvcache,
//                         norm_eps, page_size)                         store variants, decode plan
// Every name is exported by every variant (one export list per family); one that does not
// match the variant raises RuntimeError. The *_decode exports are the API's eager path
// (flashcompress.fastpath): they take each tensor once and freq only as complex64.
//
//   state        [S, width] TState, or its paged view [S / page rows, page rows, width] (page rows:
//                the ratio; online: 1), contiguous (width 4H | 2H | 3H online)
//   input        [N, 4H | 2H] TIn;  ape [8 | 128, H] TIn
//   plan         u8 [rows, 16]; plan_w u8 [rows_w, 8] (online: [rows_w, 16]); decode: ignored
//   out          [rows, H] TOut
//   norm_weight  f32 [H]; freq complex64 [T, 32] or f32 [T, 64]; out_loc i64 [L] (decode: L == rows)
//   kvcache      u8 [pages, page_bytes(page_size)] (bf16: [rows, 1024 * page_size])
//   state, input, ape, norm_weight, freq and kvcache start 16-byte aligned (rows are read by
//   16-byte vectors): a torch allocation is; a view at an odd offset raises ValueError.
// Written buffers (state, out, kvcache) must share no byte with the buffers the launch reads
// (input, ape; state, norm_weight, freq, out_loc for the cache), norm_eps lies in (0, 1).
// Every check raises a named TypeError (dtype) or ValueError (anything else) before a launch;
// device values are never read. Launches go on the caller's stream (TVMFFIEnvGetStream).
#pragma once

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cstdint>

#include "compress_launch.h"
#include "ffi_check.h"
#include "gpu_runtime.h"
#include "layout.h"

namespace flashcompress {
namespace compress_binding {

namespace chk = ::flashcompress::ffi_check;
using tvm::ffi::TensorView;

inline DLDataType dl_dtype(DType d) { return d == DType::kF32 ? chk::kFloat32 : chk::kBFloat16; }

template <class Launch, int kRatio, bool kOnline, int kHeadDim, DType kIn, DType kState,
          DType kOut, StoreFormat kFmt>
struct CompressBinding {
  static_assert(is_layer_kind(kRatio, kHeadDim, kOnline), "not a compressor layer kind (layout.h kLayerKinds)");
  static_assert(kFmt == StoreFormat::kNone || cache_format(kFmt).head_dim == kHeadDim, "format / head dim mismatch");
  static constexpr int64_t kInWidth = input_width(kRatio, kHeadDim);
  static constexpr int64_t kStateWidth = state_width(kRatio, kHeadDim, kOnline);
  static constexpr int64_t kApeRows = ape_rows(kRatio);
  static constexpr int64_t kPageRows = kOnline ? 1 : kRatio;

  // The tensors every export takes; returns the launch arguments without the outputs.
  static CompressArgs common(const TensorView& state, const TensorView& input,
                             const TensorView& ape, const TensorView& plan,
                             const TensorView& plan_w, bool is_decode) {
    chk::check_device_type(state, "kv_score_buffer", chk::kGpuDeviceType);
    const DLDevice dev = state.device();
    // [rows, width] or the paged view [pages, page rows, width] (page rows: ratio; online: 1)
    if (state.ndim() == 3) {
      chk::check_tensor(state, "kv_score_buffer", dl_dtype(kState), {chk::kAnySize, kPageRows, kStateWidth}, dev);
    } else {
      chk::check_tensor(state, "kv_score_buffer", dl_dtype(kState), {chk::kAnySize, kStateWidth}, dev);
    }
    chk::check_tensor(input, "kv_score_input", dl_dtype(kIn), {chk::kAnySize, kInWidth}, dev);
    chk::check_tensor(ape, "ape", dl_dtype(kIn), {kApeRows, kHeadDim}, dev);
    // Rows and bias rows are read as vectors of up to 16 bytes.
    chk::check_aligned(state, "kv_score_buffer", 16);
    chk::check_aligned(input, "kv_score_input", 16);
    chk::check_aligned(ape, "ape", 16);
    chk::check_tensor(plan, "plan[1]", chk::kUInt8, {chk::kAnySize, kCompressPlanBytes}, dev);
    chk::check_aligned(plan, "plan[1]", kCompressPlanBytes);
    // the state pool is updated in place while the input rows and the bias are read
    chk::check_no_overlap(state, "kv_score_buffer", input, "kv_score_input");
    chk::check_no_overlap(state, "kv_score_buffer", ape, "ape");
    CompressArgs a{};
    a.state = state.data_ptr();
    a.input = input.data_ptr();
    a.ape = ape.data_ptr();
    a.plan = static_cast<const uint8_t*>(plan.data_ptr());
    a.rows = plan.size(0);
    a.state_rows = state.numel() / kStateWidth;
    a.input_rows = input.size(0);
    a.is_decode = is_decode;
    if (is_decode) {
      TVM_FFI_CHECK(a.input_rows == a.rows, ValueError)
          << "kv_score_input: expected " << a.rows << " rows (one per decode request), got "
          << a.input_rows;
    } else {
      constexpr int64_t w_bytes = write_row_bytes(kOnline);
      chk::check_tensor(plan_w, "plan[2]", chk::kUInt8, {chk::kAnySize, w_bytes}, dev);
      chk::check_aligned(plan_w, "plan[2]", static_cast<uint64_t>(w_bytes));
      a.plan_w = static_cast<const uint8_t*>(plan_w.data_ptr());
      a.rows_w = plan_w.size(0);
      TVM_FFI_CHECK(a.input_rows >= a.rows_w, ValueError)
          << "kv_score_input: expected >= " << a.rows_w << " rows (write-list rows), got "
          << a.input_rows;
    }
    return a;
  }

  static void launch(const CompressArgs& a, DLDevice dev) {
    if (a.rows == 0 && (a.is_decode || a.rows_w == 0)) return;
    chk::launch_on(dev, &Launch::run, a);
  }

  // compress_forward: compressed rows into `out`.
  static void compress(TensorView state, TensorView input, TensorView ape, TensorView plan,
                       TensorView plan_w, TensorView out, bool is_decode) {
    TVM_FFI_CHECK(kFmt == StoreFormat::kNone, RuntimeError)
        << "compress: this variant ends in a cache store; call compress_store";
    CompressArgs a = common(state, input, ape, plan, plan_w, is_decode);
    chk::check_tensor(out, "out", dl_dtype(kOut), {a.rows, kHeadDim}, state.device());
    chk::check_aligned(out, "out", 4 * (kOut == DType::kF32 ? 4 : 2));  // rows are written by 4-element vectors
    chk::check_no_overlap(out, "out", state, "kv_score_buffer");
    chk::check_no_overlap(out, "out", input, "kv_score_input");
    chk::check_no_overlap(out, "out", ape, "ape");
    a.out = out.data_ptr();
    launch(a, state.device());
  }

  // compress_forward of a decode plan (the API's eager path): `plan` once, freq not involved.
  static void compress_decode(TensorView state, TensorView input, TensorView ape, TensorView plan,
                              TensorView out) {
    compress(state, input, ape, plan, plan, out, true);
  }

  // compress_decode into rows it allocates: [plan rows, H] TOut on the state's device, from the
  // caller's allocator (TVMFFIEnvTensorAlloc: torch's, on the current stream, as torch.empty).
  static tvm::ffi::Tensor compress_decode_alloc(TensorView state, TensorView input, TensorView ape,
                                                TensorView plan) {
    chk::check_device_type(state, "kv_score_buffer", chk::kGpuDeviceType);
    chk::check_tensor(plan, "plan[1]", chk::kUInt8, {chk::kAnySize, kCompressPlanBytes}, state.device());
    const int64_t shape[2] = {plan.size(0), kHeadDim};
    tvm::ffi::Tensor out = tvm::ffi::Tensor::FromEnvAlloc(TVMFFIEnvTensorAlloc, tvm::ffi::ShapeView(shape, 2),
                                                          dl_dtype(kOut), state.device());
    compress(state, input, ape, plan, plan, out, true);
    return out;
  }

  // compress_and_store: compressed rows straight into the paged cache.
  static void compress_store(TensorView state, TensorView input, TensorView ape, TensorView plan,
                             TensorView plan_w, TensorView norm_weight, TensorView freq,
                             TensorView out_loc, TensorView kvcache, double norm_eps,
                             int64_t page_size, bool is_decode) {
    store_impl(state, input, ape, plan, plan_w, norm_weight, freq, out_loc, kvcache, norm_eps, page_size,
               is_decode, false);
  }

  // compress_and_store of a decode plan (the API's eager path): `plan` once, and freq_cis only as
  // the API takes it (complex64 [T, 32], not the backend's fp32 [T, 64] copy of a strided table).
  static void compress_store_decode(TensorView state, TensorView input, TensorView ape, TensorView plan,
                                    TensorView norm_weight, TensorView freq, TensorView out_loc,
                                    TensorView kvcache, double norm_eps, int64_t page_size) {
    store_impl(state, input, ape, plan, plan, norm_weight, freq, out_loc, kvcache, norm_eps, page_size, true,
               true);
  }

  static void store_impl(const TensorView& state, const TensorView& input, const TensorView& ape,
                         const TensorView& plan, const TensorView& plan_w, const TensorView& norm_weight,
                         const TensorView& freq, const TensorView& out_loc, const TensorView& kvcache,
                         double norm_eps, int64_t page_size, bool is_decode, bool complex_freq) {
    TVM_FFI_CHECK(kFmt != StoreFormat::kNone, RuntimeError)
        << "compress_store: this variant has no store epilogue; call compress";
    CompressArgs a = common(state, input, ape, plan, plan_w, is_decode);
    const DLDevice dev = state.device();
    chk::check_tensor(norm_weight, "norm_weight", chk::kFloat32, {kHeadDim}, dev);
    chk::check_aligned(norm_weight, "norm_weight", 16);
    chk::check_norm_eps(norm_eps);
    const int64_t freq_rows = chk::check_freq(freq, dev, complex_freq);
    chk::check_out_loc(out_loc, a.rows, is_decode, dev);
    const int32_t page_shift = chk::check_page_size(page_size);
    const int64_t page_bytes = cache_page_bytes(kFmt, page_size);
    chk::check_tensor(kvcache, "kvcache", chk::kUInt8, {chk::kAnySize, page_bytes}, dev);
    chk::check_aligned(kvcache, "kvcache", 16);
    // the cache is written while the state, the weight, the table and the slots are read
    chk::check_no_overlap(kvcache, "kvcache", state, "kv_score_buffer");
    chk::check_no_overlap(kvcache, "kvcache", norm_weight, "norm_weight");
    chk::check_no_overlap(kvcache, "kvcache", freq, "freq_cis");
    chk::check_no_overlap(kvcache, "kvcache", out_loc, "out_loc");
    a.out_loc = static_cast<const int64_t*>(out_loc.data_ptr());
    a.store.norm_weight = static_cast<const float*>(norm_weight.data_ptr());
    a.store.freq = static_cast<const float*>(freq.data_ptr());
    a.store.freq_rows = freq_rows;
    a.store.cache = static_cast<uint8_t*>(kvcache.data_ptr());
    a.store.page_bytes = page_bytes;
    a.store.norm_eps = static_cast<float>(norm_eps);
    a.store.page_shift = page_shift;
    launch(a, dev);
  }
};

}  // namespace compress_binding
}  // namespace flashcompress
