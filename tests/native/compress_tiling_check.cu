// Host-side check of the compress family's tiling (tests/test_cluster_tiling.py): compiled with
// FC_HAS_CLUSTERS=0 and =1, it instantiates compress::Cfg for every tiling, pass, ratio, head dim
// and store format and prints one line per configuration:
//   <tiling> <ratio> <online> <head> <fmt> <pass> kChans kSplit kBatch kLanes kCSplit kThreads cluster
//   kLoadBatch kPerSplit
// Two invariants are checked at compile time too: a variant that stores (fmt != none) pools
// every row with the per-channel arithmetic (entries per split, fold batch, splits, combine
// lanes) of its compress_forward variant, so both paths add the same partials in the same order,
// and with its tiling too except in the online prefill passes, where the unstored variant
// spreads a segment over more blocks (Cfg::kSpread); and kClosing tiles every pass as kAuto.
#include <cstdio>

#include "compress.cuh"

namespace fc = flashcompress;
using fc::DType;
using fc::StoreFormat;
using fc::compress::Cfg;
using fc::Tiling;
using fc::compress::Pass;

template <Tiling kTiling, int kRatio, bool kOnline, int kHead, StoreFormat kFmt, Pass kPass>
void row(const char* fmt, const char* pass);

template <Tiling kTiling, int kRatio, bool kOnline, int kHead, StoreFormat kFmt>
void passes_for(const char* fmt) {
  row<kTiling, kRatio, kOnline, kHead, kFmt, Pass::kDecode>(fmt, "decode");
  row<kTiling, kRatio, kOnline, kHead, kFmt, Pass::kPrefill>(fmt, "prefill");
  if constexpr (kOnline) row<kTiling, kRatio, kOnline, kHead, kFmt, Pass::kOnlineWrite>(fmt, "write");
}

template <class A, class B>
constexpr bool same_tiling() {  // and the same number of loads in flight
  return A::kChans == B::kChans && A::kSplit == B::kSplit && A::kBatch == B::kBatch && A::kLanes == B::kLanes &&
         A::kThreads == B::kThreads && A::kUnroll == B::kUnroll && A::kLoadBatch == B::kLoadBatch;
}

// The same sequence of softmax merges per channel (which channels a block holds, and how many
// loads fly at once, change no value).
template <class A, class B>
constexpr bool same_arithmetic() {
  return A::kPerSplit == B::kPerSplit && A::kSplit == B::kSplit && A::kBatch == B::kBatch && A::kLanes == B::kLanes &&
         A::kVecW == B::kVecW && A::kFastExp == B::kFastExp;
}

constexpr const char* tiling_name(Tiling t) {
  return t == Tiling::kAuto ? "auto" : t == Tiling::kWholeRow ? "whole_row" : "closing";
}

template <Tiling kTiling, int kRatio, bool kOnline, int kHead, StoreFormat kFmt, Pass kPass>
void row(const char* fmt, const char* pass) {
  using C = Cfg<kRatio, kOnline, kHead, DType::kF32, DType::kF32, DType::kF32, kFmt, kTiling, kPass>;
  using N = Cfg<kRatio, kOnline, kHead, DType::kF32, DType::kF32, DType::kF32, StoreFormat::kNone, kTiling, kPass>;
  using A = Cfg<kRatio, kOnline, kHead, DType::kF32, DType::kF32, DType::kF32, kFmt, Tiling::kAuto, kPass>;
  static_assert(same_arithmetic<C, N>(), "a store variant must pool as its compress_forward variant does");
  static_assert(same_tiling<C, N>() || (kOnline && kPass != Pass::kDecode && N::kSpread),
                "a store variant tiles as its compress_forward variant, the online prefill aside");
  static_assert(fc::kHasClusters || !C::kCluster, "cluster variant on a target without clusters");
  static_assert(kTiling != Tiling::kClosing || same_tiling<C, A>(), "closing: kAuto's tiling (it differs in the decode kernel only)");
  std::printf("%s %d %d %d %s %s %d %d %d %d %d %d %d %d %d\n", tiling_name(kTiling), kRatio, kOnline ? 1 : 0, kHead,
              fmt, pass, C::kChans, C::kSplit, C::kBatch, C::kLanes, C::kCSplit, C::kThreads, C::kCluster ? 1 : 0,
              C::kLoadBatch, C::kPerSplit);
}

template <int kRatio, bool kOnline, int kHead, StoreFormat kFmt>
void passes(const char* fmt) {
  passes_for<Tiling::kAuto, kRatio, kOnline, kHead, kFmt>(fmt);
  passes_for<Tiling::kWholeRow, kRatio, kOnline, kHead, kFmt>(fmt);
  passes_for<Tiling::kClosing, kRatio, kOnline, kHead, kFmt>(fmt);
}

int main() {
  std::printf("has_clusters %d\n", fc::kHasClusters ? 1 : 0);
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
