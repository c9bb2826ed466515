// Host emulator of the store kernel (test support, runs on a machine without a GPU).
//
// Runs the exact per-row code of jit_kernel/store.cuh (store_plan_row: begin_row / finish_row of
// every warp of a row's team in turn) on the CPU:
// 32 std::threads play the 32 lanes of one warp and walk the plan rows together; the lane
// shuffles (store::host_lanes::shfl_xor) exchange values through a shared slot array between
// two barriers. Used by tests/test_store_kernel_host.py to compare the bytes with the PyTorch
// backend and with the golden vectors.
//
// Usage: store_host_emulator <dir>. <dir>/params.txt holds
//   <fmt: v4|idx_fp8|idx_fp4|bf16|v41|v41_fp4|uniform_fp8|v41_new|v41_fp4_new> <dtype: f32|bf16> <rows> <ratio> <is_decode> <page_size>
//   <eps as fp32 bit pattern> <freq_rows> <out_loc_len> <cache_bytes> [<slice: 0|64|128>]
// slice 0 (default) runs store_plan_row; 64 or 128 (V4, bf16) runs the sliced store of the compress
// kernel's epilogue (the C128 cluster's blocks, or the warps of a head-512 one-block store): the
// warp plays each slice's block / warp in turn (slice_sum_squares), adds the partial sums in
// slice order, then stores every slice with store_slice.
// and the raw little-endian tensors kv.bin ([rows, H] fp32 or bf16 bits), plan.bin ([rows, 16]),
// out_loc.bin (int64), weight.bin ([H] in the kv dtype), freq.bin (fp32 [freq_rows, 64]),
// cache.bin (cache_bytes, the cache before). Writes <dir>/cache_out.bin.
#define FC_STORE_HOST_EMULATION 1
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "store.cuh"

namespace fc = flashcompress;

namespace flashcompress {
namespace store {
namespace host_lanes {
namespace {

thread_local int t_lane = 0;

// A reusable barrier for the 32 lane threads plus the slots they exchange through.
struct Exchange {
  std::mutex m;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  float f32[kWarpLanes];
  double f64[kWarpLanes];

  void barrier() {
    std::unique_lock<std::mutex> lock(m);
    const uint64_t gen = generation;
    if (++arrived == kWarpLanes) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen; });
    }
  }
};

Exchange g_exchange;

}  // namespace

float shfl_xor(float v, int mask) {
  g_exchange.f32[t_lane] = v;
  g_exchange.barrier();
  const float other = g_exchange.f32[t_lane ^ mask];
  g_exchange.barrier();
  return other;
}

double shfl_xor(double v, int mask) {
  g_exchange.f64[t_lane] = v;
  g_exchange.barrier();
  const double other = g_exchange.f64[t_lane ^ mask];
  g_exchange.barrier();
  return other;
}

}  // namespace host_lanes
}  // namespace store
}  // namespace flashcompress

namespace {

std::vector<unsigned char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::cerr << "cannot open " << path << "\n";
    std::exit(2);
  }
  return std::vector<unsigned char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

template <int kHeadDim, fc::StoreFormat kFmt, fc::RowDtype kIn>
void run_rows(const fc::StoreKernelArgs& args) {
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < fc::store::kWarpLanes; ++lane) {
    lanes.emplace_back([&args, lane] {
      fc::store::host_lanes::t_lane = lane;
      for (int64_t row = 0; row < args.rows; ++row) fc::store::store_plan_row<kHeadDim, kFmt, kIn>(args, row, lane);
    });
  }
  for (auto& t : lanes) t.join();
}

// One lane of the sliced store of plan row `row` (kSlice-dim slices, as the cluster blocks hold them).
template <int kHeadDim, fc::StoreFormat kFmt, fc::RowDtype kIn, int kSlice>
void store_row_sliced(const fc::StoreKernelArgs& args, int64_t row, int lane) {
  namespace st = fc::store;
  constexpr int kSlices = kHeadDim / kSlice;
  st::RowShare<kHeadDim, 1> s;  // the whole row in one warp (the standalone kernel's loads)
  if (!st::begin_row<kHeadDim, kIn, 1>(args, row, 0, lane, s)) return;
  const st::RowDest& d = s.d;
  float y[kSlices][4];
  double part[kSlices];
  for (int r = 0; r < kSlices; ++r) {
    const int dim0 = r * kSlice, j = dim0 / 128;
    for (int i = 0; i < 4; ++i) y[r][i] = st::slice_lane<kSlice>(dim0, lane) ? s.v[j][i] : 0.0f;
    part[r] = st::slice_sum_squares(y[r]);
  }
  double ss = 0.0;
  for (int r = 0; r < kSlices; ++r) ss += part[r];
  for (int r = 0; r < kSlices; ++r) {
    const int dim0 = r * kSlice;
    const st::detail::BlockOperands ops = st::detail::block_operands<kHeadDim>(args.store, dim0 / 128, lane, d.position);
    st::store_slice<kHeadDim, kFmt, kSlice>(y[r], ops, lane, dim0, ss, d.loc, args.store);
  }
}

template <int kHeadDim, fc::StoreFormat kFmt, fc::RowDtype kIn, int kSlice>
void run_rows_sliced(const fc::StoreKernelArgs& args) {
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < fc::store::kWarpLanes; ++lane) {
    lanes.emplace_back([&args, lane] {
      fc::store::host_lanes::t_lane = lane;
      for (int64_t row = 0; row < args.rows; ++row) store_row_sliced<kHeadDim, kFmt, kIn, kSlice>(args, row, lane);
    });
  }
  for (auto& t : lanes) t.join();
}

template <int kHeadDim, fc::StoreFormat kFmt, fc::RowDtype kIn>
void run_mode(int slice, const fc::StoreKernelArgs& args) {
  if constexpr (kFmt == fc::StoreFormat::kV4 || kFmt == fc::StoreFormat::kBf16) {
    if (slice == 64) return run_rows_sliced<kHeadDim, kFmt, kIn, 64>(args);
    if (slice == 128) return run_rows_sliced<kHeadDim, kFmt, kIn, 128>(args);
  }
  if (slice != 0) {
    std::cerr << "slice " << slice << " is not a sliced store of this format\n";
    std::exit(2);
  }
  run_rows<kHeadDim, kFmt, kIn>(args);
}

template <int kHeadDim, fc::StoreFormat kFmt>
void run_dtype(const std::string& dtype, int slice, const fc::StoreKernelArgs& args) {
  if (dtype == "f32") {
    run_mode<kHeadDim, kFmt, fc::RowDtype::kF32>(slice, args);
  } else {
    run_mode<kHeadDim, kFmt, fc::RowDtype::kBF16>(slice, args);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: store_host_emulator <dir>\n";
    return 2;
  }
  const std::string dir = argv[1];
  std::ifstream params(dir + "/params.txt");
  std::string fmt, dtype;
  long long rows, ratio, is_decode, page_size, freq_rows, out_loc_len, cache_bytes;
  unsigned long eps_bits;
  params >> fmt >> dtype >> rows >> ratio >> is_decode >> page_size >> eps_bits >> freq_rows >> out_loc_len >>
      cache_bytes;
  if (!params) {
    std::cerr << "bad params.txt\n";
    return 2;
  }
  int slice = 0;
  if (!(params >> slice)) slice = 0;
  std::vector<unsigned char> kv = read_file(dir + "/kv.bin"), plan = read_file(dir + "/plan.bin"),
                             out_loc = read_file(dir + "/out_loc.bin"), weight = read_file(dir + "/weight.bin"),
                             freq = read_file(dir + "/freq.bin"), cache = read_file(dir + "/cache.bin");
  if (static_cast<long long>(cache.size()) != cache_bytes || static_cast<long long>(plan.size()) != rows * 16 ||
      static_cast<long long>(out_loc.size()) != out_loc_len * 8 ||
      static_cast<long long>(freq.size()) != freq_rows * 64 * 4) {
    std::cerr << "tensor sizes disagree with params.txt\n";
    return 2;
  }
  // Vector loads need aligned storage: copy into 16-byte aligned buffers.
  auto aligned = [](const std::vector<unsigned char>& src) {
    std::vector<fc::Vec<float, 4>> buf(src.size() / 16 + 1);
    std::memcpy(buf.data(), src.data(), src.size());
    return buf;
  };
  auto kv_a = aligned(kv), plan_a = aligned(plan), loc_a = aligned(out_loc), w_a = aligned(weight),
       freq_a = aligned(freq), cache_a = aligned(cache);

  int shift = 0;
  while ((1LL << shift) < page_size) ++shift;
  fc::StoreKernelArgs args{};
  args.kv = kv_a.data();
  args.plan = reinterpret_cast<const uint8_t*>(plan_a.data());
  args.out_loc = reinterpret_cast<const int64_t*>(loc_a.data());
  args.rows = rows;
  args.ratio = static_cast<uint32_t>(ratio);
  args.is_decode = is_decode != 0;
  if (dtype == "f32") {
    args.store.norm_weight = reinterpret_cast<const float*>(w_a.data());
  } else {
    args.store.norm_weight_bf16 = reinterpret_cast<const uint16_t*>(w_a.data());
  }
  args.store.freq = reinterpret_cast<const float*>(freq_a.data());
  args.store.freq_rows = freq_rows;
  args.store.cache = reinterpret_cast<uint8_t*>(cache_a.data());
  args.store.page_bytes = cache_bytes / 1;  // overwritten below
  args.store.page_shift = shift;
  const uint32_t eps_u = static_cast<uint32_t>(eps_bits);
  std::memcpy(&args.store.norm_eps, &eps_u, 4);

  // the format by its name (layout.h kCacheFormats), its page bytes from layout.h
  bool known = false;
  auto try_format = [&](auto fmt_tag) {
    constexpr fc::StoreFormat kFmt = decltype(fmt_tag)::value;
    if (known || fmt != fc::cache_format(kFmt).name) return;
    known = true;
    args.store.page_bytes = fc::cache_page_bytes(kFmt, page_size);
    run_dtype<static_cast<int>(fc::cache_format(kFmt).head_dim), kFmt>(dtype, slice, args);
  };
  using F = fc::StoreFormat;
  try_format(std::integral_constant<F, F::kV4>{});
  try_format(std::integral_constant<F, F::kIndexFp8>{});
  try_format(std::integral_constant<F, F::kIndexFp4>{});
  try_format(std::integral_constant<F, F::kBf16>{});
  try_format(std::integral_constant<F, F::kV41>{});
  try_format(std::integral_constant<F, F::kV41Fp4>{});
  try_format(std::integral_constant<F, F::kUniformFp8>{});
  try_format(std::integral_constant<F, F::kV41New>{});
  try_format(std::integral_constant<F, F::kV41Fp4New>{});
  if (!known) {
    std::cerr << "unknown format " << fmt << "\n";
    return 2;
  }
  std::ofstream out(dir + "/cache_out.bin", std::ios::binary);
  out.write(reinterpret_cast<const char*>(cache_a.data()), static_cast<std::streamsize>(cache.size()));
  return out ? 0 : 1;
}
