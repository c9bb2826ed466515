// Host-side check of the compress family's tiling (tests/test_cluster_tiling.py): compiled with
// FC_HAS_CLUSTERS=0 and =1, it instantiates compress::Cfg for every pass, ratio, head dim and
// store format and prints one line per configuration:
//   <ratio> <online> <head> <fmt> <pass> kChans kSplit kBatch kLanes kCSplit kThreads cluster
// The invariant the fused path's parity rests on is checked at compile time too: a variant that
// stores (fmt != none) pools every row with exactly the tiling of its compress_forward variant,
// so both paths add the same partials in the same order.
#include <cstdio>

#include "compress.cuh"

namespace fc = flashcompress;
using fc::DType;
using fc::StoreFormat;
using fc::compress::Cfg;
using fc::compress::Pass;

template <class A, class B>
constexpr bool same_tiling() {
  return A::kChans == B::kChans && A::kSplit == B::kSplit && A::kBatch == B::kBatch && A::kLanes == B::kLanes &&
         A::kThreads == B::kThreads && A::kUnroll == B::kUnroll;
}

template <int kRatio, bool kOnline, int kHead, StoreFormat kFmt, Pass kPass>
void row(const char* fmt, const char* pass) {
  using C = Cfg<kRatio, kOnline, kHead, DType::kF32, DType::kF32, DType::kF32, kFmt, kPass>;
  using N = Cfg<kRatio, kOnline, kHead, DType::kF32, DType::kF32, DType::kF32, StoreFormat::kNone, kPass>;
  static_assert(same_tiling<C, N>(), "a store variant must pool with its compress_forward variant's tiling");
  static_assert(fc::compress::kHasClusters || !C::kCluster, "cluster variant on a target without clusters");
  std::printf("%d %d %d %s %s %d %d %d %d %d %d %d\n", kRatio, kOnline ? 1 : 0, kHead, fmt, pass, C::kChans, C::kSplit,
              C::kBatch, C::kLanes, C::kCSplit, C::kThreads, C::kCluster ? 1 : 0);
}

template <int kRatio, bool kOnline, int kHead, StoreFormat kFmt>
void passes(const char* fmt) {
  row<kRatio, kOnline, kHead, kFmt, Pass::kDecode>(fmt, "decode");
  row<kRatio, kOnline, kHead, kFmt, Pass::kPrefill>(fmt, "prefill");
  if constexpr (kOnline) row<kRatio, kOnline, kHead, kFmt, Pass::kOnlineWrite>(fmt, "write");
}

int main() {
  std::printf("has_clusters %d\n", fc::compress::kHasClusters ? 1 : 0);
  passes<4, false, 512, StoreFormat::kNone>("none");
  passes<4, false, 512, StoreFormat::kV4>("v4");
  passes<4, false, 128, StoreFormat::kNone>("none");
  passes<4, false, 128, StoreFormat::kIndexFp8>("idx_fp8");
  passes<128, false, 512, StoreFormat::kNone>("none");
  passes<128, false, 512, StoreFormat::kV4>("v4");
  passes<128, false, 512, StoreFormat::kBf16>("bf16");
  passes<128, true, 512, StoreFormat::kNone>("none");
  passes<128, true, 512, StoreFormat::kV4>("v4");
  return 0;
}
